"""Reference values from other runtimes, keyed like tvm_probe's source values."""
