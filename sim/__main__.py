from sim.cli.main import main

raise SystemExit(main())
