//! The C memory primitives the compiler emits calls to (there is no libc in the guest).
//! Written with string instructions / volatile loads so LLVM cannot turn them back into calls to
//! themselves.

use core::arch::asm;

/// # Safety
/// `dst` must be valid for `n` byte writes.
#[no_mangle]
pub unsafe extern "C" fn memset(dst: *mut u8, c: i32, n: usize) -> *mut u8 {
    // SAFETY: the caller guarantees `dst..dst+n` is writable; DF is clear (guest keeps it so).
    unsafe {
        asm!("rep stosb", inout("rdi") dst => _, inout("rcx") n => _, in("al") c as u8,
             options(nostack, preserves_flags));
    }
    dst
}

/// # Safety
/// `dst` and `src` must be valid for `n` bytes and must not overlap.
#[no_mangle]
pub unsafe extern "C" fn memcpy(dst: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    // SAFETY: the caller guarantees both ranges are valid and disjoint; DF is clear.
    unsafe {
        asm!("rep movsb", inout("rdi") dst => _, inout("rsi") src => _, inout("rcx") n => _,
             options(nostack, preserves_flags));
    }
    dst
}

/// # Safety
/// `dst` and `src` must be valid for `n` bytes (they may overlap).
#[no_mangle]
pub unsafe extern "C" fn memmove(dst: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    if (dst as usize) <= (src as usize) || (dst as usize) >= (src as usize).wrapping_add(n) {
        // SAFETY: copying forwards is correct when dst is below src or the ranges are disjoint.
        unsafe { memcpy(dst, src, n) }
    } else {
        // SAFETY: overlapping with dst above src: copy backwards from the last byte, then
        // restore DF=0 as the ABI requires.
        unsafe {
            asm!("std", "rep movsb", "cld",
                 inout("rdi") dst.add(n - 1) => _, inout("rsi") src.add(n - 1) => _,
                 inout("rcx") n => _, options(nostack));
        }
        dst
    }
}

/// # Safety
/// `a` and `b` must be valid for `n` byte reads.
#[no_mangle]
pub unsafe extern "C" fn memcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    for i in 0..n {
        // SAFETY: in bounds by the caller's guarantee.
        let (x, y) = unsafe {
            (
                core::ptr::read_volatile(a.add(i)),
                core::ptr::read_volatile(b.add(i)),
            )
        };
        if x != y {
            return i32::from(x) - i32::from(y);
        }
    }
    0
}

/// # Safety
/// `a` and `b` must be valid for `n` byte reads.
#[no_mangle]
pub unsafe extern "C" fn bcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    // SAFETY: same contract as memcmp.
    unsafe { memcmp(a, b, n) }
}
