import sys
from pathlib import Path

# media_files.py is shared by the media tests; make it importable whatever pytest's import mode.
sys.path.insert(0, str(Path(__file__).parent))
