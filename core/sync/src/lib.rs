//! The one way conch takes a `std::sync::Mutex`: [`LockExt::locked`].
//!
//! A mutex is poisoned when a thread panicked while holding it. conch takes the guard anyway
//! rather than pass the panic on to every later caller: a panic is a defect reported where it
//! happened (the task that panicked fails), and one failed call must not wedge the runtime
//! that every other owner's calls share. No critical section in conch awaits, and each is
//! written to leave its data usable at every point that can panic (they index, push and
//! compare; the fallible work happens outside the lock).

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Takes a std mutex's guard, poisoned or not (see the crate docs for why).
pub trait LockExt<T: ?Sized> {
    /// Blocks until the lock is held; a poisoned lock's guard is returned as it is.
    fn locked(&self) -> MutexGuard<'_, T>;
}

impl<T: ?Sized> LockExt<T> for Mutex<T> {
    fn locked(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poisoned_lock_still_hands_out_its_data() {
        let m = std::sync::Arc::new(Mutex::new(vec![1]));
        let m2 = std::sync::Arc::clone(&m);
        let panicked = std::thread::spawn(move || {
            let mut g = m2.locked();
            g.push(2);
            panic!("poison it");
        })
        .join();
        assert!(panicked.is_err());
        assert!(m.is_poisoned());
        assert_eq!(*m.locked(), vec![1, 2]);
    }
}
