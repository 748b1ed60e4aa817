"""How callers reach memsvc: gRPC (`grpc/`) and the command line (`cli/`). Each converts
its own wire format to the domain's types and calls what memsvc.app builds."""
