from gitsched.cli import main

main()
