"""What a scan saw of a file: its kind, size, times and inode, and whether a file is still that one.

Identity is (device, inode, size, mtime, ctime) to the nanosecond. A file rewritten in place
changes size or mtime and always ctime; a file replaced by another has another inode, or, should
the inode number be reused, a ctime the kernel set at the new file's creation.
"""

from __future__ import annotations

import os
import stat

from cni_reaper.record import Record

_KINDS = {
    stat.S_IFREG: "file",
    stat.S_IFLNK: "symlink",
    stat.S_IFDIR: "directory",
    stat.S_IFIFO: "fifo",
    stat.S_IFSOCK: "socket",
}


class FileStat(Record):
    kind: str  # file, symlink, directory, fifo, socket, device
    size: int
    mtime: float
    ctime: float
    inode: int
    device: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, st: os.stat_result) -> FileStat:
        mtime_ns, ctime_ns = st.st_mtime_ns, st.st_ctime_ns
        return cls(
            _KINDS.get(stat.S_IFMT(st.st_mode), "device"),
            st.st_size,
            mtime_ns / 1e9,
            ctime_ns / 1e9,
            st.st_ino,
            st.st_dev,
            mtime_ns,
            ctime_ns,
        )

    def same_file(self, st: os.stat_result) -> bool:
        """Whether st is still the file that was seen, unchanged."""
        return self.changes(st) is None

    def changes(self, st: os.stat_result) -> str | None:
        """What is no longer as it was seen, said for the report; None if nothing."""
        if st.st_ino != self.inode or st.st_dev != self.device:
            return "replaced by another file"
        changed = [
            what
            for what, then, now in (
                ("size", self.size, st.st_size),
                ("mtime", self.mtime_ns, st.st_mtime_ns),
                ("ctime", self.ctime_ns, st.st_ctime_ns),
            )
            if then != now
        ]
        return f"its {' and '.join(changed)} changed" if changed else None


UNKNOWN_FILE = FileStat("unknown", 0, 0.0, 0.0, 0, 0, 0, 0)
