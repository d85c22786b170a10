"""The command line's programs: the demo (``demo.py``) and the tour (``tour.py``).

They use the public API only, as any application would; ``__main__`` dispatches to them.
"""
