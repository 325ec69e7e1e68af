//! Every suite's cases as values (name and function), for running them outside `cargo
//! test`. Built from the same lists as the `*_suite!` macros, so the two cannot drift.

use std::path::Path;

use conch_seams::files::Files;
use conch_seams::{Sandbox, SandboxPolicy, ShellExecutor, Subprocess, TerminalBackend};
use futures::future::BoxFuture;

use crate::Outcome;

/// One case: its name (the function's, as in the `*_suite!` test names) and the function.
#[derive(Debug, Clone, Copy)]
pub struct Case<F> {
    /// The case function's name.
    pub name: &'static str,
    /// Runs the case.
    pub run: F,
}

/// A case over one seam.
pub type OneSeam<S> = for<'a> fn(&'a S) -> BoxFuture<'a, Outcome>;

/// A sandbox case: the sandbox, and the subprocess provider that spawns what it wraps.
pub type SandboxFn = for<'a> fn(&'a dyn Sandbox, &'a dyn Subprocess) -> BoxFuture<'a, Outcome>;

/// A files case: the provider, and the base directory its scratch directories go in.
pub type FilesFn = for<'a> fn(&'a dyn Files, &'a Path) -> BoxFuture<'a, Outcome>;

/// A files sandbox case: the provider, and the policy it enforces (its own workspace root).
pub type FilesSandboxFn = for<'a> fn(&'a dyn Files, &'a SandboxPolicy) -> BoxFuture<'a, Outcome>;

/// Expands a case list into a `const` of [`Case`]s whose functions box the case's future.
macro_rules! one_seam_list {
    ($konst:ident, $module:ident, $seam:ty ; $($case:ident),* $(,)?) => {
        #[doc = concat!("The `", stringify!($module), "` suite, in order.")]
        pub const $konst: &[Case<OneSeam<$seam>>] = &[
            $(Case { name: stringify!($case), run: |p| Box::pin(crate::$module::$case(p)) },)*
        ];
    };
}

macro_rules! sandbox_list {
    ($konst:ident ; $($case:ident),* $(,)?) => {
        /// The `sandbox` suite, in order.
        pub const $konst: &[Case<SandboxFn>] = &[
            $(Case {
                name: stringify!($case),
                run: |s, p| Box::pin(crate::sandbox::$case(s, p)),
            },)*
        ];
    };
}

macro_rules! two_arg_list {
    ($konst:ident, $module:ident, $ty:ty ; $($case:ident),* $(,)?) => {
        #[doc = concat!("The `", stringify!($module), "` suite, in order.")]
        pub const $konst: &[Case<$ty>] = &[
            $(Case {
                name: stringify!($case),
                run: |f, x| Box::pin(crate::$module::$case(f, x)),
            },)*
        ];
    };
}

crate::__subprocess_cases!(one_seam_list { SUBPROCESS, subprocess, dyn Subprocess });
crate::__terminal_process_cases!(one_seam_list {
    TERMINAL_PROCESS,
    terminal_process,
    dyn Subprocess
});
crate::__shell_cases!(one_seam_list { SHELL, shell, dyn ShellExecutor });
crate::__terminal_cases!(one_seam_list { TERMINAL, terminal, dyn TerminalBackend });
crate::__sandbox_cases!(sandbox_list { SANDBOX });
crate::__files_cases!(two_arg_list { FILES, files, FilesFn });
crate::__files_sandbox_cases!(two_arg_list { FILES_SANDBOX, files_sandbox, FilesSandboxFn });
