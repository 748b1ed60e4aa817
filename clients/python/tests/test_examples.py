"""The agents in examples/ (issue 39), each run twice as a user would: the second run
remembers what the first one said, through memsvc."""

from __future__ import annotations

import subprocess
import sys

from .test_client import ROOT, WRITER, ServerTestCase


class ExamplesTest(ServerTestCase):
    def run_example(self, name: str, message: str, session: str) -> str:
        done = subprocess.run(
            [
                *(sys.executable, str(ROOT / "examples" / name), message),
                *("--target", self.target, "--token", WRITER, "--session", session),
            ],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        self.assertEqual(done.returncode, 0, done.stderr)
        return done.stdout.strip()

    def test_the_agents_sdk_example_remembers_the_first_run(self) -> None:
        first = self.run_example("openai_agents_memory.py", "I live in Lyon.", "ex-agents")
        self.assertEqual(first, "Nice to meet you.")
        second = self.run_example("openai_agents_memory.py", "Where do I live?", "ex-agents")
        self.assertEqual(second, "Earlier you said: I live in Lyon.")

    def test_the_langchain_example_finds_the_first_run(self) -> None:
        said = "My sister Lena looks after the dog on Fridays."
        first = self.run_example("langchain_memory.py", said, "ex-chat")
        self.assertEqual(first, "evidence: (nothing yet)")
        second = self.run_example("langchain_memory.py", "Who looks after the dog?", "ex-chat")
        self.assertIn("Lena looks after the dog on Fridays", second)

    def check_remembers(self, name: str, greeting: str, session: str) -> None:
        """An example whose second run answers with what memsvc gave it from the first."""
        said = "My sister Lena looks after the dog on Fridays."
        self.assertEqual(self.run_example(name, said, session), greeting)
        second = self.run_example(name, "Who looks after the dog?", session)
        self.assertTrue(second.startswith("remembered: "), second)
        self.assertIn("Lena looks after the dog on Fridays", second)

    def test_the_llama_index_example_remembers_the_first_run(self) -> None:
        self.check_remembers("llama_index_memory.py", "remembered: (nothing yet)", "ex-llama")

    def test_the_google_adk_example_remembers_the_first_run(self) -> None:
        self.check_remembers("google_adk_memory.py", "Nice to meet you.", "ex-adk")
