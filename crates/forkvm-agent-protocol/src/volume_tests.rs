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

/// The relay against a fake `/dev/fuse` (a datagram socketpair keeps one
/// request per read, as the device does) and a fake host on a socketpair.
#[cfg(feature = "relay")]
mod relay {
    use super::super::Relay;
    use super::*;
    use std::fs::File;
    use std::os::fd::OwnedFd;
    use std::os::unix::net::{UnixDatagram, UnixStream};
    use std::time::Duration;

    fn req(opcode: u32, unique: u64) -> Vec<u8> {
        let mut r = vec![0u8; 40];
        r[0..4].copy_from_slice(&40u32.to_le_bytes());
        r[4..8].copy_from_slice(&opcode.to_le_bytes());
        r[8..16].copy_from_slice(&unique.to_le_bytes());
        r
    }

    fn reply(unique: u64) -> Vec<u8> {
        let mut r = vec![0u8; 16];
        r[0..4].copy_from_slice(&16u32.to_le_bytes());
        r[8..16].copy_from_slice(&unique.to_le_bytes());
        r
    }

    fn unique_of(b: &[u8]) -> u64 {
        u64::from_le_bytes(b[8..16].try_into().unwrap())
    }

    fn next(host: &mut UnixStream) -> VolFrame {
        host.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        read_frame(host).unwrap().unwrap()
    }

    fn nothing(host: &mut UnixStream) {
        host.set_read_timeout(Some(Duration::from_millis(150)))
            .unwrap();
        match read_frame(host) {
            Err(VolFrameError::Io(e)) => assert!(matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            )),
            other => panic!("expected nothing, got {other:?}"),
        }
    }

    fn kernel_gets(kernel: &UnixDatagram) -> u64 {
        kernel
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut b = [0u8; 64];
        let n = kernel.recv(&mut b).unwrap();
        unique_of(&b[..n])
    }

    #[test]
    fn hold_quiesce_resend_and_duplicates() {
        let (kernel, dev) = UnixDatagram::pair().unwrap();
        let (guest, mut host) = UnixStream::pair().unwrap();
        let relay = Relay::start(File::from(OwnedFd::from(guest))).unwrap();
        relay.add_mount(2, File::from(OwnedFd::from(dev))).unwrap();

        // Nothing is forwarded before the first RESUME.
        kernel.send(&req(1, 1)).unwrap();
        nothing(&mut host);
        write_frame(&mut host, FrameKind::Resume, 0, &[1]).unwrap();
        let f = next(&mut host);
        assert_eq!(
            (f.kind, f.volume, unique_of(&f.payload)),
            (FrameKind::Request, 2, 1)
        );

        // FORGET is forwarded but never waits for a reply.
        kernel.send(&req(2, 2)).unwrap();
        kernel.send(&req(1, 3)).unwrap();
        assert_eq!(unique_of(&next(&mut host).payload), 2);
        assert_eq!(unique_of(&next(&mut host).payload), 3);

        // QUIESCE: new requests are held; QUIESCED once 1 and 3 are answered.
        write_frame(&mut host, FrameKind::Quiesce, 0, &[]).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        kernel.send(&req(1, 4)).unwrap();
        nothing(&mut host);
        assert_eq!(relay.held(), 1);
        write_frame(&mut host, FrameKind::Reply, 2, &reply(1)).unwrap();
        assert_eq!(kernel_gets(&kernel), 1);
        nothing(&mut host);
        write_frame(&mut host, FrameKind::Reply, 2, &reply(3)).unwrap();
        assert_eq!(kernel_gets(&kernel), 3);
        assert_eq!(next(&mut host).kind, FrameKind::Quiesced);

        // RESUME(0) forwards what was held.
        write_frame(&mut host, FrameKind::Resume, 0, &[0]).unwrap();
        assert_eq!(unique_of(&next(&mut host).payload), 4);
        kernel.send(&req(1, 5)).unwrap();
        assert_eq!(unique_of(&next(&mut host).payload), 5);

        // The host goes away; a new one connects and asks for a resend.
        drop(host);
        std::thread::sleep(Duration::from_millis(50));
        kernel.send(&req(1, 6)).unwrap();
        let (guest2, mut host2) = UnixStream::pair().unwrap();
        relay.reconnect(File::from(OwnedFd::from(guest2)));
        nothing(&mut host2);
        write_frame(&mut host2, FrameKind::Resume, 0, &[1]).unwrap();
        let order: Vec<u64> = (0..3)
            .map(|_| unique_of(&next(&mut host2).payload))
            .collect();
        assert_eq!(
            order,
            [4, 5, 6],
            "unanswered first in send order, then held"
        );

        // A duplicate reply (after a resend) reaches the kernel once.
        write_frame(&mut host2, FrameKind::Reply, 2, &reply(4)).unwrap();
        write_frame(&mut host2, FrameKind::Reply, 2, &reply(4)).unwrap();
        write_frame(&mut host2, FrameKind::Reply, 2, &reply(5)).unwrap();
        assert_eq!(kernel_gets(&kernel), 4);
        assert_eq!(kernel_gets(&kernel), 5);
        assert_eq!(relay.outstanding(), 1);
    }
}
