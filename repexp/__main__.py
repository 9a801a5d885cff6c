import sys

from repexp.cli import main

sys.exit(main())
