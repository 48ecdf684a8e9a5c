"""core: the bottom layer every app builds on — bot config, process services, logs, the background loop.

The build's version lives here: `maibot --version`, the package metadata, and the stamp in the data dir
that keeps an older build from starting on data a newer one has written (core.datadir).
"""

__version__ = "0.1.0"
