"""Method tests: make the shared stub Teacher (stub_teacher.py) importable by name."""
import sys
from pathlib import Path

# Under --import-mode=importlib test directories are not on sys.path.
sys.path.insert(0, str(Path(__file__).parent))
