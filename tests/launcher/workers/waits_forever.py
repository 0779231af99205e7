"""A worker that never ends: it blocks in a function whose name the stack dump must show."""
import threading


def wait_for_a_message_that_never_comes() -> None:
    threading.Event().wait()


if __name__ == "__main__":
    print("worker waiting", flush=True)
    wait_for_a_message_that_never_comes()
