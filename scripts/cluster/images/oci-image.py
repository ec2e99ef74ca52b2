#!/usr/bin/env python3
"""Write a container image as an OCI archive (an OCI image layout in one tar), without a
registry, a daemon or a base image to pull: the layers are assembled here from Debian
packages (unpacked with dpkg-deb) and local files, and `ctr images import` loads the result.

The output is reproducible: every tar entry is owned by root with mtime 0, entries are sorted,
and gzip carries no timestamp, so the same inputs give the same digests (the base layer of the
engine and operator images is one blob, stored once).

    oci-image.py --out engine.tar --name ghcr.io/tidegate/tidegate-engine:0.1.0 \\
        --base-deb libc6.deb --base-deb libgcc-s1.deb --nonroot \\
        --file target/release/tidegate-engine:/usr/local/bin/tidegate-engine:755 \\
        --entrypoint /usr/local/bin/tidegate-engine --user 65532:65532 --expose 8000
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import subprocess
import sys
import tarfile
from dataclasses import dataclass, field

# What a runtime image does not need from a package (distroless leaves these out too).
SKIP_PREFIXES = (
    "usr/share/doc/",
    "usr/share/man/",
    "usr/share/info/",
    "usr/share/lintian/",
    "usr/share/locale/",
    "usr/share/bug/",
)
NONROOT_UID = 65532
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass
class Layer:
    """A tar layer being assembled: path → (TarInfo, bytes or None)."""

    entries: dict[str, tuple[tarfile.TarInfo, bytes | None]] = field(default_factory=dict)

    def add(self, info: tarfile.TarInfo, data: bytes | None) -> None:
        info.name = _clean(info.name)
        if not info.name or info.name.startswith(SKIP_PREFIXES):
            return
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        info.mtime = 0
        self._parents(info.name)
        self.entries[info.name] = (info, data)

    def _parents(self, path: str) -> None:
        parts = path.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            d = "/".join(parts[:i])
            if d not in self.entries:
                self.entries[d] = (_dir(d), None)

    def add_file(self, dest: str, data: bytes, mode: int) -> None:
        info = tarfile.TarInfo(dest)
        info.size = len(data)
        info.mode = mode
        self.add(info, data)

    def add_dir(self, dest: str, mode: int = 0o755) -> None:
        self.add(_dir(dest, mode), None)

    def tar_bytes(self) -> bytes:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for name in sorted(self.entries):
                info, data = self.entries[name]
                tar.addfile(info, io.BytesIO(data) if data is not None else None)
        return buf.getvalue()


def _clean(path: str) -> str:
    """A tar member name relative to the image root: no leading ./ or /, no trailing /."""
    while path.startswith("./"):
        path = path[2:]
    path = path.lstrip("/").rstrip("/")
    return "" if path == "." else path


def _dir(path: str, mode: int = 0o755) -> tarfile.TarInfo:
    info = tarfile.TarInfo(path)
    info.type = tarfile.DIRTYPE
    info.mode = mode
    info.mtime = 0
    return info


def add_deb(layer: Layer, deb: str) -> None:
    """The files of a .deb (its data.tar), as dpkg would unpack them."""
    try:
        raw = subprocess.run(
            ["dpkg-deb", "--fsys-tarfile", deb], check=True, capture_output=True
        ).stdout
    except subprocess.CalledProcessError as e:
        sys.exit(f"oci-image: cannot read {deb}: {e.stderr.decode(errors='replace').strip()}")
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        for info in tar.getmembers():
            data = tar.extractfile(info).read() if info.isfile() else None
            if info.islnk():
                info.linkname = _clean(info.linkname)
            layer.add(info, data)


def add_nonroot(layer: Layer) -> None:
    """/etc/passwd and /etc/group with root and nonroot (65532), and a writable /tmp, as the
    distroless :nonroot images have them."""
    passwd = (
        "root:x:0:0:root:/root:/sbin/nologin\n"
        f"nonroot:x:{NONROOT_UID}:{NONROOT_UID}:nonroot:/home/nonroot:/sbin/nologin\n"
    )
    group = f"root:x:0:\nnonroot:x:{NONROOT_UID}:\n"
    layer.add_file("etc/passwd", passwd.encode(), 0o644)
    layer.add_file("etc/group", group.encode(), 0o644)
    layer.add_dir("tmp", 0o1777)
    home = _dir("home/nonroot", 0o700)
    layer.add(home, None)
    home_info = layer.entries["home/nonroot"][0]
    home_info.uid = home_info.gid = NONROOT_UID


def dockerfile_runtime(path: str) -> dict:
    """What the last stage of a Dockerfile says about the runtime image: USER, EXPOSE,
    ENTRYPOINT, CMD, and where it copies its binary (`COPY --from=... SRC DEST`), so that the
    image written here is the one the Dockerfile describes (one definition)."""
    with open(path) as f:
        text = f.read().replace("\\\n", " ")
    stage: list[str] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.upper().startswith("FROM "):
            stage = []
        stage.append(line)
    out: dict = {"expose": [], "copy": []}
    for line in stage:
        word, _, rest = line.partition(" ")
        word, rest = word.upper(), rest.strip()
        if word == "USER":
            out["user"] = rest
        elif word == "EXPOSE":
            out["expose"] += [int(p.split("/")[0]) for p in rest.split()]
        elif word in ("ENTRYPOINT", "CMD"):
            if not rest.startswith("["):
                sys.exit(f"oci-image: {path}: {word} must be in JSON (exec) form")
            out[word.lower()] = json.loads(rest)
        elif word == "COPY":
            parts = [p for p in rest.split() if not p.startswith("--")]
            out["copy"].append(parts[-1])
    return out


def parse_file_spec(spec: str) -> tuple[str, str, int]:
    parts = spec.split(":")
    if len(parts) not in (2, 3) or not parts[1].startswith("/"):
        sys.exit(f"oci-image: --file {spec!r}: expected SRC:/DEST[:MODE]")
    mode = int(parts[2], 8) if len(parts) == 3 else 0o644
    return parts[0], parts[1], mode


@dataclass
class Blobs:
    """The blobs of the layout, by digest."""

    items: dict[str, bytes] = field(default_factory=dict)

    def put(self, data: bytes) -> dict:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        self.items[digest] = data
        return {"digest": digest, "size": len(data)}


def build(args: argparse.Namespace) -> bytes:
    blobs = Blobs()
    layers = []
    base = Layer()
    for deb in args.base_deb:
        add_deb(base, deb)
    if args.nonroot:
        add_nonroot(base)
    app = Layer()
    for spec in args.file:
        src, dest, mode = parse_file_spec(spec)
        with open(src, "rb") as f:
            app.add_file(dest, f.read(), mode)
    for layer in (base, app):
        if not layer.entries:
            continue
        tar = layer.tar_bytes()
        gz = gzip.compress(tar, compresslevel=6, mtime=0)
        desc = blobs.put(gz)
        desc["mediaType"] = "application/vnd.oci.image.layer.v1.tar+gzip"
        layers.append((desc, "sha256:" + hashlib.sha256(tar).hexdigest()))

    env = [f"PATH={DEFAULT_PATH}"] + list(args.env)
    config: dict = {"Env": env, "WorkingDir": args.workdir}
    if args.user:
        config["User"] = args.user
    if args.entrypoint:
        config["Entrypoint"] = args.entrypoint
    if args.cmd:
        config["Cmd"] = args.cmd
    if args.expose:
        config["ExposedPorts"] = {f"{p}/tcp": {} for p in args.expose}
    image_config = {
        "architecture": "amd64",
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [d for _, d in layers]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "oci-image.py"}
                    for _ in layers],
    }
    cfg = blobs.put(json.dumps(image_config, sort_keys=True).encode())
    cfg["mediaType"] = "application/vnd.oci.image.config.v1+json"
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": cfg,
        "layers": [d for d, _ in layers],
    }
    man = blobs.put(json.dumps(manifest, sort_keys=True).encode())
    man["mediaType"] = "application/vnd.oci.image.manifest.v1+json"
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            dict(man, annotations={
                "io.containerd.image.name": name,
                "org.opencontainers.image.ref.name": name.rsplit(":", 1)[-1],
            })
            for name in args.name
        ],
    }
    out = Layer()
    out.add_file("oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode(), 0o644)
    out.add_file("index.json", json.dumps(index, sort_keys=True).encode(), 0o644)
    for digest, data in blobs.items.items():
        out.add_file("blobs/sha256/" + digest.split(":", 1)[1], data, 0o644)
    return out.tar_bytes()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="the OCI archive to write")
    p.add_argument("--name", action="append", required=True,
                   help="full image reference (repeatable), e.g. ghcr.io/x/y:1.0")
    p.add_argument("--base-deb", action="append", default=[],
                   help="a .deb whose files go into the base layer (repeatable)")
    p.add_argument("--nonroot", action="store_true",
                   help="add /etc/passwd and /etc/group with nonroot (65532) and /tmp")
    p.add_argument("--file", action="append", default=[],
                   help="SRC:/DEST[:MODE] into the top layer (repeatable)")
    p.add_argument("--entrypoint", nargs="+", default=None)
    p.add_argument("--cmd", nargs="+", default=None)
    p.add_argument("--user", default="")
    p.add_argument("--env", action="append", default=[], help="K=V (repeatable)")
    p.add_argument("--workdir", default="/")
    p.add_argument("--expose", action="append", type=int, default=[])
    p.add_argument("--dockerfile",
                   help="take USER, EXPOSE, ENTRYPOINT and CMD from this Dockerfile's last stage")
    p.add_argument("--binary",
                   help="with --dockerfile: the file its last stage COPYs in (to the same place)")
    args = p.parse_args()
    if args.dockerfile:
        rt = dockerfile_runtime(args.dockerfile)
        args.user = args.user or rt.get("user", "")
        args.expose = args.expose or rt["expose"]
        args.entrypoint = args.entrypoint or rt.get("entrypoint")
        args.cmd = args.cmd or rt.get("cmd")
        if args.binary:
            if len(rt["copy"]) != 1:
                sys.exit(f"oci-image: {args.dockerfile}: expected one COPY in the last stage, "
                         f"found {len(rt['copy'])}")
            args.file.append(f"{args.binary}:{rt['copy'][0]}:755")
    for name in args.name:
        if ":" not in name.rsplit("/", 1)[-1]:
            sys.exit(f"oci-image: --name {name!r}: give a tag (NAME:TAG)")
    data = build(args)
    with open(args.out, "wb") as f:
        f.write(data)


if __name__ == "__main__":
    main()
