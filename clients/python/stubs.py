"""memsvc-client's generated stubs, made from the server's (memsvc/v1 in this repository,
written by `make proto`): one copy of generated code is checked in, and this module renames
its imports for the client's package. The build (setup.py) runs it into the wheel; `make
lint` and the tests run it into the source tree (git-ignored there)."""

from __future__ import annotations

import sys
from pathlib import Path

SERVER_STUBS = Path(__file__).resolve().parents[2] / "memsvc" / "v1"
FILES = ("memory_pb2.py", "memory_pb2.pyi", "memory_pb2_grpc.py")


def client_stub(text: str) -> str:
    """A server stub's text as the client's: `memsvc.v1` imports become `memsvc_client.v1`."""
    return text.replace("\nfrom memsvc.v1 import", "\nfrom memsvc_client.v1 import")


def write_stubs(package_dir: Path) -> None:
    """Write the client's stubs into `package_dir` (a memsvc_client/v1 directory)."""
    for name in FILES:
        source = SERVER_STUBS / name
        if not source.is_file():
            raise SystemExit(
                f"memsvc-client: {source} not found: build the client from a clone of the"
                " memsvc repository (its stubs come from the server's, `make proto`)"
            )
        (package_dir / name).write_text(client_stub(source.read_text()))


if __name__ == "__main__":
    write_stubs(
        Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "memsvc_client" / "v1"
    )
