from tools.testweb.cli import main

raise SystemExit(main())
