import sys

from ebmlab.cli import main

sys.exit(main())
