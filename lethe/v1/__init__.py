"""Generated gRPC code for lethe.v1; regenerate with scripts/gen_protos.py."""
