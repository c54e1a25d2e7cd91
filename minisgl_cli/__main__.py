from minisgl_cli.app import main

main()
