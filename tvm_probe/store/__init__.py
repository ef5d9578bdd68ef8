"""On-disk storage formats used by tvm_probe."""
