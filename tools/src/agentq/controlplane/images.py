"""Container images the local node makes itself (no registry can be pulled from).

``single_binary_image`` writes a ``docker save``-format archive holding one
static executable: containerd imports it (``ctr images import``) like any image.
The node uses it for its pod sandbox ("pause") image. Pure: builds bytes, no I/O
but the one file it reads and the one it writes.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

# Fixed so that the same binary always gives the same image (and the same digest).
_EPOCH = 0


def _tar(members: dict[str, tuple[bytes, int]]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, (data, mode) in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = mode
            info.mtime = _EPOCH
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def single_binary_image(binary: Path, *, reference: str, dest: Path, arch: str = "amd64") -> str:
    """Write an image ``reference`` whose only file is ``/<binary name>`` (its entrypoint).

    Returns the image's config digest.
    """
    name = binary.name
    layer = _tar({name: (binary.read_bytes(), 0o755)})
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = json.dumps(
        {
            "architecture": arch,
            "os": "linux",
            "created": "1970-01-01T00:00:00Z",
            "config": {"Entrypoint": [f"/{name}"], "User": "65535:65535"},
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
            "history": [{"created": "1970-01-01T00:00:00Z", "created_by": f"agentq: /{name}"}],
        },
        sort_keys=True,
    ).encode()
    config_digest = hashlib.sha256(config).hexdigest()
    layer_dir = diff_id.removeprefix("sha256:")
    manifest = json.dumps(
        [
            {
                "Config": f"{config_digest}.json",
                "RepoTags": [reference],
                "Layers": [f"{layer_dir}/layer.tar"],
            }
        ]
    ).encode()
    dest.write_bytes(
        _tar(
            {
                f"{config_digest}.json": (config, 0o644),
                f"{layer_dir}/layer.tar": (layer, 0o644),
                "manifest.json": (manifest, 0o644),
            }
        )
    )
    return f"sha256:{config_digest}"
