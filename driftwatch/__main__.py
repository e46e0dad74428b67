from driftwatch.commands.cli import main

main()
