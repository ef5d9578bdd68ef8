"""``python -m tvm_probe``: the same as the ``tvm-probe`` command."""
from .app.cli import console_main

if __name__ == "__main__":
    console_main()
