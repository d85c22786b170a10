"""The command line's programs: the demo (``demo.py``), the tour (``tour.py``), and
``slots`` (``slots.py``), which shows what a slot store holds.

They use the public API only, as any application would; ``__main__`` dispatches to them.
"""
