"""Train one configuration: `python run.py [group=option ...] [key=value ...]`, or a sweep with `-m` (= `swinexp`)."""
from swinexp.app.cli import main

if __name__ == "__main__":
    main()
