use super::*;

fn round_trip(kind: FrameKind, volume: u8, payload: &[u8]) {
    let bytes = encode(kind, volume, payload);
    let (f, used) = decode(&bytes).unwrap().unwrap();
    assert_eq!(used, bytes.len());
    assert_eq!(f.kind, kind);
    assert_eq!(f.volume, volume);
    assert_eq!(f.payload, payload);
    let g = read_frame(&mut &bytes[..]).unwrap().unwrap();
    assert_eq!(f, g);
}

#[test]
fn every_kind_round_trips() {
    round_trip(FrameKind::Request, 3, &[1, 2, 3, 4, 5]);
    round_trip(FrameKind::Reply, 200, &vec![7u8; 70_000]);
    round_trip(FrameKind::Quiesce, 0, &[]);
    round_trip(FrameKind::Quiesced, 0, &[]);
    round_trip(FrameKind::Resume, 0, &[1]);
    round_trip(FrameKind::Resume, 0, &[0]);
    let f = decode(&encode(FrameKind::Resume, 0, &[1]))
        .unwrap()
        .unwrap()
        .0;
    assert!(f.resend());
}

#[test]
fn partial_input_needs_more() {
    let bytes = encode(FrameKind::Request, 1, b"hello");
    for cut in 0..bytes.len() {
        assert!(decode(&bytes[..cut]).unwrap().is_none(), "cut {cut}");
    }
    // Two frames back to back decode one at a time.
    let mut two = bytes.clone();
    two.extend_from_slice(&encode(FrameKind::Quiesced, 0, &[]));
    let (_, used) = decode(&two).unwrap().unwrap();
    assert_eq!(
        decode(&two[used..]).unwrap().unwrap().0.kind,
        FrameKind::Quiesced
    );
}

#[test]
fn unknown_kind_is_rejected() {
    for k in [0u8, 6, 255] {
        let mut bytes = encode(FrameKind::Request, 0, b"x");
        bytes[4] = k;
        assert!(matches!(decode(&bytes), Err(VolFrameError::UnknownKind(b)) if b == k));
        assert!(matches!(
            read_frame(&mut &bytes[..]),
            Err(VolFrameError::UnknownKind(_))
        ));
    }
}

#[test]
fn too_long_is_rejected_before_allocating() {
    let mut bytes = encode(FrameKind::Request, 0, b"x");
    bytes[..4].copy_from_slice(&(MAX_FRAME + 1).to_le_bytes());
    assert!(matches!(decode(&bytes), Err(VolFrameError::TooLong(_))));
    assert!(matches!(
        read_frame(&mut &bytes[..]),
        Err(VolFrameError::TooLong(_))
    ));
}

#[test]
fn short_length_is_rejected() {
    for len in 0u32..4 {
        let mut bytes = len.to_le_bytes().to_vec();
        bytes.extend_from_slice(&[1, 0, 0, 0]);
        assert!(matches!(decode(&bytes), Err(VolFrameError::Short(l)) if l == len));
        assert!(matches!(decode(&bytes[..4]), Err(VolFrameError::Short(_))));
        assert!(matches!(
            read_frame(&mut &bytes[..]),
            Err(VolFrameError::Short(_))
        ));
    }
}

#[test]
fn nonzero_flags_are_rejected() {
    let mut bytes = encode(FrameKind::Reply, 0, b"x");
    bytes[6] = 1;
    assert!(matches!(decode(&bytes), Err(VolFrameError::BadFlags(1))));
}

#[test]
fn control_payloads_are_checked() {
    let bad = [
        encode(FrameKind::Quiesce, 0, b"x"),
        encode(FrameKind::Quiesced, 0, b"x"),
        encode(FrameKind::Resume, 0, &[]),
        encode(FrameKind::Resume, 0, &[2]),
        encode(FrameKind::Resume, 0, &[1, 1]),
    ];
    for b in bad {
        assert!(matches!(decode(&b), Err(VolFrameError::BadPayload(..))));
        assert!(matches!(
            read_frame(&mut &b[..]),
            Err(VolFrameError::BadPayload(..))
        ));
    }
}

#[test]
fn eof_inside_a_frame_is_truncated_and_at_boundary_is_none() {
    assert!(read_frame(&mut &[][..]).unwrap().is_none());
    let bytes = encode(FrameKind::Request, 0, b"hello");
    for cut in 1..bytes.len() {
        assert!(matches!(
            read_frame(&mut &bytes[..cut]),
            Err(VolFrameError::Truncated)
        ));
    }
}
