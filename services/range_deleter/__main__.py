"""python -m services.range_deleter"""
from services.thin import main

if __name__ == "__main__":
    main("range-deleter")
