"""maibot: a MaiBot-style chat-bot core as one deployable Django project."""

# The build's version: `maibot --version`, the package metadata, and the stamp in the data dir that keeps
# an older build from starting on data a newer one has written (maibot.datadir).
__version__ = "0.1.0"
