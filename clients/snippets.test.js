// The Node and TypeScript programs of docs/surfaces/clients.md, run as printed (only the
// server's address changes), after the set-up commands the page gives, which are the ones
// `make test-clients` itself runs before this file.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { readFileSync, rmSync, writeFileSync } from "node:fs";
import path from "node:path";
import { connect } from "./node/memsvc.js";
import { ROOT, startMemsvc } from "./testing.js";

const PAGE = readFileSync(path.join(ROOT, "docs", "surfaces", "clients.md"), "utf8");
const README = readFileSync(path.join(ROOT, "README.md"), "utf8");

/** The fenced blocks of the page (or another text) in `lang`, as written. */
function blocks(lang, text = PAGE) {
  return [...text.matchAll(new RegExp("```" + lang + "\\n([\\s\\S]*?)```", "g"))].map((m) => m[1]);
}

function program(lang, name) {
  const found = blocks(lang).filter((b) => b.startsWith(`// ${name}`));
  assert.equal(found.length, 1, `one ${lang} block named ${name}`);
  return found[0];
}

let server;

before(async () => {
  server = await startMemsvc(async (target) => {
    const client = connect(target);
    try {
      await client.EmbedChunk({ query: "ready?" }, { deadlineMs: 5_000 });
    } finally {
      client.close();
    }
  });
});

after(() => server?.stop());

test("the set-up commands are the ones make test-clients runs", () => {
  const setUp = blocks("sh").filter((b) => b.startsWith("(cd clients && npm install"));
  assert.equal(setUp.length, 2);
  const makefile = readFileSync(path.join(ROOT, "Makefile"), "utf8");
  assert.match(makefile, /cd clients && npm install/);
  const scripts = JSON.parse(readFileSync(path.join(ROOT, "clients", "package.json"), "utf8")).scripts;
  assert.match(scripts.test, /^npm run generate && /);
  assert.match(setUp[1], /npm run generate/);
});

function run(source, dir, file, argv, env = {}) {
  const where = path.join(dir, file);
  writeFileSync(where, source);
  try {
    return execFileSync(argv[0], [...argv.slice(1), where], {
      cwd: dir,
      encoding: "utf8",
      timeout: 120_000,
      env: { ...process.env, ...env },
    });
  } finally {
    rmSync(where, { force: true });
  }
}

test("the Node program runs as printed", () => {
  const source = program("js", "quickstart.mjs").replace('"127.0.0.1:50051"', `"${server.target}"`);
  assert.notEqual(source, program("js", "quickstart.mjs"));
  const out = run(source, ROOT, `.quickstart-${process.pid}.mjs`, [process.execPath]);
  assert.match(out, /bookshelf/);
  assert.match(out, /field: 'top_k'/);
});

test("the TypeScript program runs as printed", () => {
  const printed = program("ts", "quickstart.ts");
  const source = printed.replace('"http://127.0.0.1:50051"', `"http://${server.target}"`);
  assert.notEqual(source, printed);
  const tsx = path.join(ROOT, "clients", "node_modules", ".bin", "tsx");
  const out = run(source, path.join(ROOT, "clients", "ts"), `.quickstart-${process.pid}.ts`, [tsx]);
  assert.match(out, /flowerpot/);
  assert.match(out, /field: 'top_k'/);
});

// The integration snippets (README.md's and this page's) use `client` and `model`, which an
// app has: the stand-ins give them (this memsvc and an offline model), put before the snippet.
test("the TypeScript integration snippets run as printed", () => {
  const snippets = [...blocks("ts", README), ...blocks("ts")].filter((b) => b.includes("./integrations/"));
  const expected = [
    ["ai-sdk.js", "memoryToolsModel()", "text", /blue pot/],
    ["openai-agents.js", "new EchoModel()", "again.finalOutput", /saw 3 items; first "I'm Ana."/],
  ];
  assert.equal(snippets.length, expected.length);
  const tsx = path.join(ROOT, "clients", "node_modules", ".bin", "tsx");
  for (const [module, model, result, printed] of expected) {
    const snippet = snippets.find((b) => b.includes(`./integrations/${module}`));
    const source =
      'import { EchoModel, memoryToolsModel, memsvcClient } from "./testdata/stand-ins.js";\n' +
      `const client = memsvcClient();\nconst model = ${model};\n` +
      `${snippet}\nconsole.log(${result});\n`;
    const env = { MEMSVC_TARGET: server.target, OPENAI_AGENTS_DISABLE_TRACING: "1" };
    const out = run(source, path.join(ROOT, "clients", "ts"), `.snippet-${process.pid}.ts`, [tsx], env);
    assert.match(out, printed);
  }
});
