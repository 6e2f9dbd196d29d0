import sys

from cni_reaper.cli import main

sys.exit(main())
