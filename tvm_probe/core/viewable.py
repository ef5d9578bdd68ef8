"""``probe.view()`` and ``load_dump(...).view()``: a run or a dump in Google's Model Explorer."""
from __future__ import annotations

import importlib

#: The module that shows a run (its ``view(results, comparison, model, port=, open_browser=)``).
#: Found by name when ``.view()`` is called, as pandas finds its plotting backend: it sits in
#: the show stage, above the probe and the store that offer ``.view()``, and needs Model Explorer.
VIEWER = "tvm_probe.show.view"


class Viewable:
    """What :class:`~tvm_probe.Probe` and :class:`~tvm_probe.store.dump.DumpReader` share to be
    looked at (see :mod:`tvm_probe.show.view`)."""

    def view(self, comparison=None, model=None, port: int | None = None, open_browser: bool = True) -> None:
        """Look at this run in Google's Model Explorer until Ctrl-C (:func:`tvm_probe.show.view.view`).

        Needs the ``view`` extra (:func:`tvm_probe.core.install.install_hint` says how to install
        it).  ``model``: the source model, where the run does not record it; ``comparison``: what
        to show as errors (a dump defaults to its reference).
        """
        importlib.import_module(VIEWER).view(self, comparison, model, port=port, open_browser=open_browser)
