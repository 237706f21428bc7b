//! execl, execlp and execle: the variadic exec family, interposed so a
//! program that hands a socket to a child with them (`fork` + `dup2` +
//! `execl`, the classic inetd child) gets the hand-back of `exec.rs`; libc's
//! own execl* call its internal execve, which this library never sees.
//!
//! Stable Rust cannot define a C-variadic function, so each is a naked
//! trampoline that stores the argument registers next to each other and
//! calls [`collect`] with where they are and where the caller's stack
//! arguments start. Variadic pointer arguments travel as named ones do on
//! the Linux x86-64 and AArch64 ABIs (the registers after `path`, then the
//! stack), so the list is read from there up to its NULL, as libc does
//! (and, for execle, the environment after it).

use libc::{c_char, c_int};

/// Argument registers after `path`: rsi, rdx, rcx, r8, r9; x1..x7.
#[cfg(target_arch = "x86_64")]
const IN_REGS: usize = 5;
#[cfg(target_arch = "aarch64")]
const IN_REGS: usize = 7;

const EXECL: c_int = 0;
const EXECLP: c_int = 1;
const EXECLE: c_int = 2;

/// Argument `i` after `path`.
///
/// SAFETY: `regs` holds IN_REGS arguments and `stack` the caller's stack
/// arguments; `i` is within the caller's list (up to its NULL, and for
/// execle one more).
unsafe fn nth(regs: *const *const c_char, stack: *const *const c_char, i: usize) -> *const c_char {
    if i < IN_REGS {
        *regs.add(i)
    } else {
        *stack.add(i - IN_REGS)
    }
}

/// Gathers the list into an argv and calls the interposed execv, execvp or
/// execve. The argv is on the stack for up to 255 arguments, as libc's.
///
/// SAFETY: called only by the trampolines below, with the caller's
/// registers and stack arguments of an execl-family call.
unsafe extern "C" fn collect(
    path: *const c_char,
    regs: *const *const c_char,
    stack: *const *const c_char,
    kind: c_int,
) -> c_int {
    let mut n = 0;
    while !nth(regs, stack, n).is_null() {
        n += 1;
    }
    let mut small = [std::ptr::null::<c_char>(); 256];
    let mut big = Vec::new();
    let argv: &mut [*const c_char] = if n < small.len() {
        &mut small[..=n]
    } else {
        big.resize(n + 1, std::ptr::null());
        &mut big
    };
    for (i, a) in argv.iter_mut().enumerate().take(n) {
        *a = nth(regs, stack, i);
    }
    match kind {
        EXECLE => {
            let envp = nth(regs, stack, n + 1) as *const *const c_char;
            crate::exec::execve(path, argv.as_ptr(), envp)
        }
        EXECLP => crate::exec::execvp(path, argv.as_ptr()),
        _ => crate::exec::execv(path, argv.as_ptr()),
    }
}

#[cfg(target_arch = "x86_64")]
macro_rules! trampoline {
    ($name:ident, $kind:expr) => {
        /// The variadic exec of this name (see the module).
        #[unsafe(naked)]
        #[no_mangle]
        pub unsafe extern "C" fn $name() {
            // The five argument registers after `path` in order at rsp,
            // the caller's stack arguments above them and the return
            // address; rsp stays 16-byte aligned at the call.
            core::arch::naked_asm!(
                "push r9",
                "push r8",
                "push rcx",
                "push rdx",
                "push rsi",
                "mov rsi, rsp",
                "lea rdx, [rsp + 48]",
                "mov ecx, {kind}",
                "call {collect}",
                "add rsp, 40",
                "ret",
                kind = const $kind,
                collect = sym collect,
            )
        }
    };
}

#[cfg(target_arch = "aarch64")]
macro_rules! trampoline {
    ($name:ident, $kind:expr) => {
        /// The variadic exec of this name (see the module).
        #[unsafe(naked)]
        #[no_mangle]
        pub unsafe extern "C" fn $name() {
            // A frame of 80 bytes: the link registers, then x1..x7 in
            // order; the caller's stack arguments start where it ends.
            core::arch::naked_asm!(
                "stp x29, x30, [sp, #-80]!",
                "mov x29, sp",
                "stp x1, x2, [sp, #16]",
                "stp x3, x4, [sp, #32]",
                "stp x5, x6, [sp, #48]",
                "str x7, [sp, #64]",
                "add x1, sp, #16",
                "add x2, sp, #80",
                "mov w3, #{kind}",
                "bl {collect}",
                "ldp x29, x30, [sp], #80",
                "ret",
                kind = const $kind,
                collect = sym collect,
            )
        }
    };
}

trampoline!(execl, EXECL);
trampoline!(execlp, EXECLP);
trampoline!(execle, EXECLE);
