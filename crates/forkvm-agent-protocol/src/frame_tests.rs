//! Framing tests: round trips, partial and corrupt frames.

use super::*;

fn exec() -> HostMsg {
    HostMsg::Exec {
        id: 7,
        argv: vec!["python3".into(), "-c".into(), "print(1)".into()],
        env: BTreeMap::from([("A".into(), "b".into())]),
        cwd: Some("/tmp".into()),
        timeout_ms: Some(1000),
        user: None,
        detach: false,
        log_path: None,
    }
}

#[test]
fn roundtrip_through_buffer_and_reader() {
    let bytes = encode(&exec(), b"stdin bytes").unwrap();
    let mut buf = bytes.clone();
    let f: Frame<HostMsg> = decode(&mut buf).unwrap().unwrap();
    assert_eq!(f.msg, exec());
    assert_eq!(f.payload, b"stdin bytes");
    assert!(buf.is_empty());
    let f2: Frame<HostMsg> = read_frame(&mut &bytes[..]).unwrap().unwrap();
    assert_eq!(f2, f);
}

#[test]
fn partial_frames_wait_for_more_bytes() {
    let bytes = encode(&GuestMsg::ShutdownAck { id: 1 }, b"").unwrap();
    for cut in 0..bytes.len() {
        let mut buf = bytes[..cut].to_vec();
        assert!(decode::<GuestMsg>(&mut buf).unwrap().is_none(), "cut {cut}");
        assert_eq!(buf.len(), cut);
    }
}

#[test]
fn two_frames_back_to_back() {
    let mut buf = encode(&HostMsg::Ping { id: 1 }, b"").unwrap();
    buf.extend(encode(&HostMsg::Ping { id: 2 }, b"x").unwrap());
    let a: Frame<HostMsg> = decode(&mut buf).unwrap().unwrap();
    let b: Frame<HostMsg> = decode(&mut buf).unwrap().unwrap();
    assert_eq!(a.msg.id(), 1);
    assert_eq!(b.msg.id(), 2);
    assert_eq!(b.payload, b"x");
}

#[test]
fn corrupt_magic_is_rejected() {
    let mut bytes = encode(&HostMsg::Ping { id: 1 }, b"").unwrap();
    bytes[0] = b'X';
    assert!(matches!(
        decode::<HostMsg>(&mut bytes),
        Err(FrameError::BadMagic(_))
    ));
}

#[test]
fn oversized_lengths_are_rejected_without_allocating() {
    let mut bytes = encode(&HostMsg::Ping { id: 1 }, b"").unwrap();
    bytes[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(matches!(
        decode::<HostMsg>(&mut bytes.clone()),
        Err(FrameError::PayloadTooLarge(_))
    ));
    assert!(matches!(
        read_frame::<HostMsg, _>(&mut &bytes[..]),
        Err(FrameError::PayloadTooLarge(_))
    ));
    bytes[4..8].copy_from_slice(&(MAX_HEADER + 1).to_le_bytes());
    assert!(matches!(
        decode::<HostMsg>(&mut bytes),
        Err(FrameError::HeaderTooLarge(_))
    ));
}

#[test]
fn corrupt_header_json_is_rejected() {
    let mut bytes = encode(&HostMsg::Ping { id: 1 }, b"").unwrap();
    bytes[PREFIX_LEN] = b'!';
    assert!(matches!(
        decode::<HostMsg>(&mut bytes),
        Err(FrameError::BadHeader(_))
    ));
}

#[test]
fn unknown_message_type_is_rejected() {
    let header = br#"{"type":"format_disk","id":1}"#;
    let mut bytes = MAGIC.to_vec();
    bytes.extend((header.len() as u32).to_le_bytes());
    bytes.extend(0u32.to_le_bytes());
    bytes.extend(header);
    assert!(matches!(
        decode::<HostMsg>(&mut bytes),
        Err(FrameError::BadHeader(_))
    ));
}

#[test]
fn truncated_stream_is_an_error_not_eof() {
    let bytes = encode(&HostMsg::Ping { id: 1 }, b"abc").unwrap();
    let r = read_frame::<HostMsg, _>(&mut &bytes[..bytes.len() - 1]);
    assert!(matches!(r, Err(FrameError::Io(_))));
    let r = read_frame::<HostMsg, _>(&mut &bytes[..0]);
    assert!(matches!(r, Ok(None)));
}

#[test]
fn oversized_payload_is_refused_by_encoder() {
    let big = vec![0u8; MAX_PAYLOAD as usize + 1];
    assert!(matches!(
        encode(&HostMsg::Ping { id: 1 }, &big),
        Err(FrameError::PayloadTooLarge(_))
    ));
}

/// A reader that gives one byte per call and is interrupted by a signal
/// before each, as a blocking read in a process with signal handlers can be.
struct Interrupting<'a> {
    bytes: &'a [u8],
    interrupt_next: bool,
}

impl Read for Interrupting<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.interrupt_next = !self.interrupt_next;
        if !self.interrupt_next {
            return Err(io::ErrorKind::Interrupted.into());
        }
        let n = buf.len().min(1).min(self.bytes.len());
        buf[..n].copy_from_slice(&self.bytes[..n]);
        self.bytes = &self.bytes[n..];
        Ok(n)
    }
}

#[test]
fn an_interrupted_read_is_retried_not_an_error() {
    let bytes = encode(&exec(), b"payload").unwrap();
    let mut r = Interrupting {
        bytes: &bytes,
        interrupt_next: true,
    };
    let f: Frame<HostMsg> = read_frame(&mut r).unwrap().unwrap();
    assert_eq!((f.msg, &f.payload[..]), (exec(), &b"payload"[..]));
    // And at the end, after an interruption, a clean EOF.
    assert!(read_frame::<HostMsg, _>(&mut r).unwrap().is_none());
}
