"""``probe.view()`` and ``load_dump(...).view()``: a run or a dump in Google's Model Explorer."""
from __future__ import annotations


class Viewable:
    """What :class:`~tvm_probe.Probe` and :class:`~tvm_probe.store.dump.DumpReader` share to be
    looked at (see :mod:`tvm_probe.view`)."""

    def view(self, comparison=None, model=None, port: int | None = None, open_browser: bool = True) -> None:
        """Look at this run in Google's Model Explorer until Ctrl-C (:func:`tvm_probe.view.view`).

        Needs ``pip install "tvm_probe[view]"``.  ``model``: the source model, where the run does
        not record it; ``comparison``: what to show as errors (a dump defaults to its reference).
        """
        from ..show.view import view

        view(self, comparison, model, port=port, open_browser=open_browser)
