"""python -m services.balancer"""
from services.thin import main

if __name__ == "__main__":
    main("balancer")
