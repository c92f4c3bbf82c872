from trainfit.cli.main import main

raise SystemExit(main())
