//! Every call into redb goes through [`guarded`]: redb trusts its file's structure and can
//! panic on a damaged one, which here becomes [`StoreError::Damaged`] — a one-line error naming
//! the repair — never a crash.

use std::cell::Cell;
use std::panic::AssertUnwindSafe;
use std::sync::Once;

use crate::StoreError;

thread_local! {
    /// Depth of [`guarded`] calls on this thread: their panics are errors, not messages.
    static GUARDED: Cell<u32> = const { Cell::new(0) };
}

/// Runs `f`, turning a panic into [`StoreError::Damaged`]. redb trusts its file's structure and
/// can panic on a damaged one (an index out of range in a page); every call into it goes
/// through here, so a damaged `meta.redb` is a clear error with the repair path, never a
/// crash. The panic message is not printed (the process's panic hook is wrapped once to stay
/// silent inside these calls and to behave as before everywhere else).
pub(crate) fn guarded<T>(f: impl FnOnce() -> Result<T, StoreError>) -> Result<T, StoreError> {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if GUARDED.with(Cell::get) == 0 {
                previous(info);
            }
        }));
    });
    GUARDED.with(|g| g.set(g.get() + 1));
    let result = std::panic::catch_unwind(AssertUnwindSafe(f));
    GUARDED.with(|g| g.set(g.get() - 1));
    result.unwrap_or_else(|panic| {
        let why = panic
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| panic.downcast_ref::<&str>().copied())
            .unwrap_or("the database engine failed on it");
        Err(StoreError::Damaged(why.to_string()))
    })
}
