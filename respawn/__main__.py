from respawn.app.cli import main

main()
