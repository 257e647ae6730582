from supervisor.cli.main import main

raise SystemExit(main())
