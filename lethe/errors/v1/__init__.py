"""Generated protobuf code of proto package lethe.errors.v1 (ErrorReason); regenerate with scripts/gen_protos.py."""
