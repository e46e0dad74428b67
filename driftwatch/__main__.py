from driftwatch.cli import main

main()
