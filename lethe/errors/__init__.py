"""Generated code of the lethe.errors proto packages; regenerate with scripts/gen_protos.py."""
