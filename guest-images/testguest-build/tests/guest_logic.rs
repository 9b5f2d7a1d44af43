//! Host unit tests of the test guest's pure parsing code (`testguest/src/parse.rs`, compiled
//! here as an ordinary module: it uses only `core`).

#[path = "../../testguest/src/parse.rs"]
mod parse;

use parse::*;

#[test]
fn cmdline_params() {
    let c = b"console=ttyS0 testguest.scenario=echo  virtio_mmio.device=4K@0xc0001000:5\tvirtio_mmio.device=4K@0xc0002000:6 testguest.scenario2=x";
    assert_eq!(
        params(c, "testguest.scenario").collect::<Vec<_>>(),
        vec![&b"echo"[..]]
    );
    assert_eq!(params(c, "virtio_mmio.device").count(), 2);
    assert_eq!(params(c, "missing").count(), 0);
    assert_eq!(params(b"", "x").count(), 0);
    assert_eq!(params(b"x", "x").count(), 0, "a bare key has no value");
    assert_eq!(params(b"x=", "x").collect::<Vec<_>>(), vec![&b""[..]]);
}

#[test]
fn numbers_and_sizes() {
    assert_eq!(parse_num(b"0"), Some(0));
    assert_eq!(parse_num(b"123"), Some(123));
    assert_eq!(parse_num(b"0xc0001000"), Some(0xc000_1000));
    assert_eq!(parse_num(b"0XfF"), Some(255));
    assert_eq!(parse_num(b"18446744073709551615"), Some(u64::MAX));
    for bad in [
        &b""[..],
        b"0x",
        b"12a",
        b"-1",
        b"18446744073709551616",
        b"0x10000000000000000",
        b" 1",
    ] {
        assert_eq!(parse_num(bad), None, "{:?}", String::from_utf8_lossy(bad));
    }
    assert_eq!(parse_size(b"4K"), Some(4096));
    assert_eq!(parse_size(b"1m"), Some(1 << 20));
    assert_eq!(parse_size(b"0x1000"), Some(4096));
    assert_eq!(parse_size(b"K"), None);
    assert_eq!(parse_size(b""), None);
    assert_eq!(parse_size(b"0xffffffffffffffffK"), None, "overflow");
}

#[test]
fn virtio_mmio_device_values() {
    assert_eq!(
        parse_virtio_mmio(b"4K@0xc0001000:5"),
        Some((4096, 0xc000_1000, Some(5)))
    );
    assert_eq!(
        parse_virtio_mmio(b"0x1000@3221229568"),
        Some((4096, 0xc000_1000, None))
    );
    assert_eq!(parse_virtio_mmio(b"4K@0xc0001000:x"), None);
    assert_eq!(parse_virtio_mmio(b"4K0xc0001000:5"), None);
    assert_eq!(parse_virtio_mmio(b"@:"), None);
}

#[test]
fn trailing_numbers_in_payloads() {
    assert_eq!(trailing_number(b"microvirt pong 7"), Some(7));
    assert_eq!(trailing_number(b"microvirt seq 12\0\0\0\0"), Some(12));
    assert_eq!(trailing_number(b"microvirt seq"), None);
    assert_eq!(trailing_number(b"microvirt seq x1"), None);
    assert_eq!(trailing_number(b"microvirt seq "), None);
    assert_eq!(trailing_number(b""), None);
}

fn feed(bytes: &[u8]) -> Option<usize> {
    let mut d = CtrlAltDel::default();
    bytes.iter().position(|&b| d.feed(b))
}

#[test]
fn ctrl_alt_del_in_both_scancode_sets() {
    // Set 2 as the VMM's i8042 sends it (presses, then releases).
    let set2 = [
        0x14, 0x11, 0xe0, 0x71, 0xe0, 0xf0, 0x71, 0xf0, 0x11, 0xf0, 0x14,
    ];
    assert_eq!(feed(&set2), Some(3));
    // Set 1.
    assert_eq!(
        feed(&[0x1d, 0x38, 0xe0, 0x53, 0xe0, 0xd3, 0xb8, 0x9d]),
        Some(3)
    );
    // Keypad Del works too; order of Ctrl and Alt does not matter.
    assert_eq!(feed(&[0x11, 0x14, 0x71]), Some(2));
    // Released modifiers do not count.
    assert_eq!(feed(&[0x14, 0xf0, 0x14, 0x11, 0xe0, 0x71]), None);
    assert_eq!(feed(&[0x1d, 0x9d, 0x38, 0xe0, 0x53]), None);
    // Del alone, or other keys, never trigger.
    assert_eq!(feed(&[0xe0, 0x71, 0xe0, 0x53, 0x1c, 0x9c]), None);
    assert_eq!(feed(&[]), None);
}
