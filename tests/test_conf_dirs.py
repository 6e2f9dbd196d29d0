"""The conf dirs read as libcni's ConfFiles and os.ReadFile read them (a symlinked conf file is
followed), but only what root could have written: configs choose the plugin run as root and
what it reads on stdin. Real files, modes, owners and symlinks."""

from __future__ import annotations

import json
import os
from pathlib import Path

from cni_reaper.netconf import load_conf_dirs
from tests.private_node import cannot_run

NOBODY = 65534


def conflist(name: str, kind: str = "host-local") -> bytes:
    return json.dumps({"cniVersion": "1.0.0", "name": name, "plugins": [{"type": kind}]}).encode()


def write(path: Path, data: bytes, mode: int = 0o644) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    path.chmod(mode)
    return path


def test_a_symlinked_conf_file_is_followed_to_a_trusted_target(tmp_path: Path) -> None:
    """Skipping it meant no DEL and a leaked address; libcni reads it through the link."""
    conf_dir = tmp_path / "etc/cni/net.d"
    target = write(tmp_path / "etc/cni/templates/mynet.json", conflist("mynet"))
    conf_dir.mkdir()
    (conf_dir / "10-mynet.conflist").symlink_to("../templates/mynet.json")

    configs = load_conf_dirs([str(conf_dir)])

    assert configs.problems == ()
    mynet = configs.get("mynet")
    assert mynet is not None
    assert mynet.source == str(conf_dir / "10-mynet.conflist")
    assert target.exists()


def test_untrusted_conf_files_and_targets_are_skipped_and_named(tmp_path: Path) -> None:
    conf_dir = tmp_path / "net.d"
    write(conf_dir / "10-loose.conflist", conflist("loose"), mode=0o666)
    open_dir = tmp_path / "open"
    write(open_dir / "evil.conflist", conflist("evil", kind="evil"))
    open_dir.chmod(0o777)
    (conf_dir / "20-evil.conflist").symlink_to(open_dir / "evil.conflist")
    write(tmp_path / "elsewhere/group.conflist", conflist("group"), mode=0o664)
    (conf_dir / "30-group.conflist").symlink_to(tmp_path / "elsewhere/group.conflist")
    write(conf_dir / "40-good.conflist", conflist("good"))

    configs = load_conf_dirs([str(conf_dir)])

    assert sorted(configs.networks) == ["good"]
    assert configs.problems == (
        f"{conf_dir / '10-loose.conflist'}: {conf_dir / '10-loose.conflist'} is writable by "
        "group or others (mode 0666)",
        f"{conf_dir / '20-evil.conflist'}: {open_dir} is writable by group or others (mode 0777)",
        f"{conf_dir / '30-group.conflist'}: {tmp_path / 'elsewhere/group.conflist'} is writable "
        "by group or others (mode 0664)",
    )


def test_conf_files_of_another_user_are_skipped(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        cannot_run("giving a file to another user (chown) needs root")
    conf_dir = tmp_path / "net.d"
    theirs = write(conf_dir / "10-theirs.conflist", conflist("theirs"))
    os.chown(theirs, NOBODY, NOBODY)

    configs = load_conf_dirs([str(conf_dir)])

    assert configs.networks == {}
    assert configs.problems == (f"{theirs}: {theirs} is owned by uid {NOBODY}",)


def test_links_to_dirs_dangling_links_and_loops_are_problems_not_crashes(tmp_path: Path) -> None:
    conf_dir = tmp_path / "net.d"
    (conf_dir / "real-dir.conf").mkdir(parents=True)  # ConfFiles skips a dir: no problem
    (tmp_path / "a-dir").mkdir()
    (conf_dir / "10-dir.conf").symlink_to(tmp_path / "a-dir")
    (conf_dir / "20-dangling.conf").symlink_to("nowhere.conf")
    (conf_dir / "30-loop.conf").symlink_to("30-loop.conf")
    write(conf_dir / "40-good.conf", json.dumps({"name": "good", "type": "host-local"}).encode())

    configs = load_conf_dirs([str(conf_dir)])

    assert sorted(configs.networks) == ["good"]
    assert configs.problems == (
        f"{conf_dir / '10-dir.conf'}: a symlink to a directory, {tmp_path / 'a-dir'}",
        f"{conf_dir / '20-dangling.conf'}: {conf_dir / 'nowhere.conf'} does not exist",
        f"{conf_dir / '30-loop.conf'}: {conf_dir / '30-loop.conf'}: too many levels of symbolic "
        "links",
    )


def test_an_untrusted_conf_dir_is_not_read(tmp_path: Path) -> None:
    """Whoever may write etc can swap net.d for a dir of their own."""
    conf_dir = tmp_path / "etc/cni/net.d"
    write(conf_dir / "10-a.conflist", conflist("a"))
    (tmp_path / "etc").chmod(0o777)
    missing = tmp_path / "missing"

    configs = load_conf_dirs([str(conf_dir), str(missing)])

    assert configs.networks == {}
    assert configs.problems == (
        f"{conf_dir}: {tmp_path / 'etc'} is writable by group or others (mode 0777); its "
        "configs not read",
    )


def test_the_files_libcni_lists_and_the_order_it_reads_them(tmp_path: Path) -> None:
    conf_dir = tmp_path / "net.d"
    for name in ("a.conf.bak", "b.conflist~", "c.yaml", "conf"):
        write(conf_dir / name, conflist(name))
    write(conf_dir / ".conf", json.dumps({"name": "dot", "type": "host-local"}).encode())
    # Go sorts names by their bytes: U+E000 is EE 80 80, before the undecodable byte FF, though
    # Python's str, where FF is U+DCFF, sorts it after.
    write(conf_dir / "\ue000.conflist", conflist("first"))
    write(conf_dir / os.fsdecode(b"\xff.conflist"), conflist("first", kind="second"))

    configs = load_conf_dirs([str(conf_dir)])

    assert sorted(configs.networks) == ["dot", "first"]
    assert configs.networks["first"].plugin_types == ("host-local",)
    assert configs.problems == ()
