from bapsql.cli import main

main()
