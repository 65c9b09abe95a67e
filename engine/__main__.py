import sys

import engine
from engine.extra import missing_message

if engine.MISSING_EXTRA is not None:
    print(f"error: {missing_message(engine.MISSING_EXTRA)}", file=sys.stderr)
    sys.exit(2)

from engine.cli import main

sys.exit(main())
