from nanoasr.cli import main

raise SystemExit(main())
