import sys

from personalize.cli import main

sys.exit(main())
