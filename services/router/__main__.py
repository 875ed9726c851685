"""python -m services.router"""
from services.thin import main

if __name__ == "__main__":
    main("router")
