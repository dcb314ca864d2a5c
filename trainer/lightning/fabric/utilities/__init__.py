"""Lightning's ``lightning.fabric.utilities``: ``imports.py`` (platform flags)."""
