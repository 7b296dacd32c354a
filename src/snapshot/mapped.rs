//! A snapshot file mapped read-only, so that the pickle decoder reads it in place (no copy of
//! the file in memory) and gives back the pages it has passed: the decoder reads front to back
//! once, so the resident part of the file stays a few MiB whatever its size.
//!
//! The mapping is private and read-only; giving pages back (`MADV_DONTNEED`) only drops them
//! from this process, and a later read of them reads the file again, so no slice into the map
//! ever sees other bytes. What the map relies on: the file is not truncated while it is read
//! (reading a page past a new end raises SIGBUS; docs/robustness.md says so).

use std::fs::File;
use std::os::unix::io::AsRawFd;

/// A whole file mapped read-only.
pub(crate) struct Mapped {
    ptr: *mut libc::c_void,
    len: usize,
    /// Bytes before this offset were given back already.
    released: std::cell::Cell<usize>,
}

impl Mapped {
    /// Maps `file`; `None` when it is empty.
    pub(crate) fn of(file: &File) -> std::io::Result<Option<Mapped>> {
        let len = usize::try_from(file.metadata()?.len()).map_err(|_| std::io::Error::other("file larger than the address space"))?;
        if len == 0 {
            return Ok(None);
        }
        // SAFETY: a fresh private read-only mapping of a descriptor we hold; the kernel picks the
        // address; failure is checked below.
        let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_PRIVATE, file.as_raw_fd(), 0) };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: advice on the mapping just made; it changes no contents.
        unsafe { libc::madvise(ptr, len, libc::MADV_SEQUENTIAL) };
        Ok(Some(Mapped { ptr, len, released: std::cell::Cell::new(0) }))
    }

    /// The file's bytes.
    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: the mapping is `len` readable bytes until `drop`, which needs `&mut self`, so
        // it outlives the borrow; nothing writes to a private read-only mapping.
        unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.len) }
    }

    /// Gives back the pages wholly before `offset` (the reader will not come back to them; if
    /// it does, they are read from the file again).
    pub(crate) fn release_before(&self, offset: usize) {
        // SAFETY: sysconf reads a system constant.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096).max(1);
        let end = offset.min(self.len) / page * page;
        let start = self.released.get();
        if end > start {
            // SAFETY: [start, end) lies inside the mapping and is page-aligned (the mapping
            // starts on a page); dropping pages of a private read-only file mapping keeps its
            // contents (they are read from the file again if touched).
            unsafe { libc::madvise((self.ptr as *mut u8).add(start) as *mut libc::c_void, end - start, libc::MADV_DONTNEED) };
            self.released.set(end);
        }
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `of`, unmapped once.
        unsafe { libc::munmap(self.ptr, self.len) };
    }
}
