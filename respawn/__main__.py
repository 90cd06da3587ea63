from respawn.cli import main

main()
