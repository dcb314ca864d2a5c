import os
import sys

# tests/helpers.py is imported by name, also inside workers the trainer spawns.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
