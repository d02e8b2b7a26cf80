// gnll serve's page: asks /v1/chat/completions (or /v1/responses, /v1/messages) like any client and
// draws the uncertainty it returns.
"use strict";
const $ = (id) => document.getElementById(id);
const state = { config: null, examples: [], history: [], auth: false };

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = $("api-key").value.trim();
  if (key) h.Authorization = "Bearer " + key;
  return h;
}

async function getJSON(url) {
  const r = await fetch(url, { headers: headers() });
  const body = await r.json();
  if (!r.ok) throw new Error((body.error && (body.error.message || body.error)) || r.statusText);
  return body;
}

// An error replaces the result: an earlier answer (its gold, its mark) would read as this one's.
function showError(msg) {
  $("error").textContent = msg || "";
  $("error").hidden = !msg;
  if (msg) $("result").hidden = true;
}

// The browser's own words for a request that never got an answer ("Failed to fetch", "NetworkError
// when attempting to fetch resource.") say nothing to a reader; everything else is the server's.
function human(e) {
  if (e instanceof TypeError && /fetch|network/i.test(e.message)) {
    return "Cannot reach the gnll server (it may have stopped or restarted): start it again, then ask again.";
  }
  return e.message;
}

function fmt(x, digits = 4) {
  return x === null || x === undefined ? "–" : Number(x).toFixed(digits);
}

// Probability 0 -> red, 1 -> green; light enough to read the token on it.
function shade(p) {
  return `hsl(${Math.round(120 * p)}, 75%, ${Math.round(88 - 18 * (1 - Math.abs(2 * p - 1)))}%)`;
}

async function init() {
  try {
    const health = await (await fetch("/health")).json();
    state.auth = health.auth;
    $("api-key").hidden = !health.auth;
    if (health.auth && !$("api-key").value) {
      $("server-info").textContent = `${health.model} (${health.mode}) — enter the API key`;
      $("api-key").addEventListener("change", init, { once: true });
      return;
    }
    state.config = await getJSON("/ui/api/config");
    const c = state.config;
    $("server-info").textContent = `${c.model} · ${c.mode === "proxy" ? "proxy to " + c.upstream : "in-process"} · policy ${c.policy.policy}`;
    // Every API the server answers with uncertainty (chat, completions, Responses, Messages).
    $("server-info").title = `Answers with uncertainty on ${c.apis.join(", ")}`;
    // The rule in use, before any answer: what "abstain" will mean on this server.
    // Under annotate nothing is decided, but a calibration still gives P(correct): name it.
    $("rule").textContent = c.policy.policy === "annotate"
      ? "No policy: every answer is sent as it is, with its uncertainty" +
        (c.policy.calibrated ? ` and P(correct) from ${c.policy.source}` : "") +
        " (gnll serve --policy sets one)."
      : `Rule in use: policy ${c.policy.policy}; ${c.policy.source}`;
    $("task").innerHTML = c.tasks.map((t) => `<option>${t}</option>`).join("");
    await loadExamples();
  } catch (e) {
    showError(e instanceof TypeError ? human(e) : "Cannot reach the server: " + e.message);
  }
}

async function loadExamples() {
  const sel = $("example");
  sel.innerHTML = '<option value="">(choose a question)</option>';
  try {
    const body = await getJSON(`/ui/api/examples?task=${encodeURIComponent($("task").value)}&limit=25`);
    state.examples = body.examples;
    body.examples.forEach((ex, i) => {
      const o = document.createElement("option");
      o.value = String(i);
      o.textContent = ex.question.length > 90 ? ex.question.slice(0, 87) + "…" : ex.question;
      sel.appendChild(o);
    });
  } catch (e) {
    state.examples = [];
    sel.innerHTML = `<option value="">(no data: ${e.message})</option>`;
  }
}

function currentPrompt() {
  const i = $("example").value;
  const typed = $("question").value.trim();
  // A server started with --prompt-format instruction wraps the question in the instruction itself.
  // Its calibration applies to that prompt only, so a picked question is sent bare there too (a
  // 5-shot prompt would be wrapped as if it were the question); elsewhere it goes with the task's
  // 5-shot prompt, as gnll eval asks it.
  const serverAsks = (state.config.prompt_format || {}).chat === "instruction";
  const zeroShot = "gnll ask's zero-shot instruction";
  if (typed) {
    const wrapped = `${state.config.instruction}\nQuestion: ${typed}\nAnswer:`;
    return { question: typed, prompt: serverAsks ? typed : wrapped, gold: null, asked: zeroShot };
  }
  if (i !== "") {
    const ex = state.examples[Number(i)];
    const prompt = serverAsks ? ex.question : ex.prompt;
    const asked = serverAsks
      ? `${zeroShot} (this server's --prompt-format instruction)`
      : `the 5-shot prompt of ${$("task").value}, as gnll eval asks it`;
    return { question: ex.question, prompt, gold: ex.answers, numeric: ex.numeric_answer, asked };
  }
  return null;
}

// The tools offered (an array of OpenAI tool definitions) or null; an error names what is wrong.
function offeredTools() {
  const text = $("tools").value.trim();
  if (!text) return null;
  let tools;
  try {
    tools = JSON.parse(text);
  } catch (e) {
    throw new Error("Tools: not JSON (" + e.message + ")");
  }
  if (!Array.isArray(tools) || !tools.length) throw new Error("Tools: give a JSON array of tool definitions");
  return tools;
}

async function ask(ev) {
  ev.preventDefault();
  showError("");
  let q = currentPrompt();
  if (!q) return showError("Type a question or pick one.");
  let tools;
  try {
    tools = offeredTools();
  } catch (e) {
    return showError(e.message);
  }
  if (tools && $("api").value !== "chat") return showError("Tools are offered through /v1/chat/completions: pick it.");
  // With tools the typed question is the user's message as it is (no question-answer instruction).
  if (tools && $("question").value.trim()) q = { ...q, prompt: q.question, asked: "tools, the question as the user's message" };
  $("ask").disabled = true;
  try {
    const [path, request] = apiRequest($("api").value, q.prompt, tools);
    const r = await fetch(path, { method: "POST", headers: headers(), body: JSON.stringify(request) });
    if (!r.ok) {
      const body = await r.json();
      throw new Error(body.error ? body.error.message : r.statusText);
    }
    const choice = await readStream(r);
    const verdict = q.gold ? await judge(q, choice.message.content) : null;
    render(q, choice, verdict);
  } catch (e) {
    showError(human(e));
  } finally {
    $("ask").disabled = false;
  }
}

// The route and body that ask the question greedily, streamed, through one of the three APIs. The
// Responses API has no stop sequences (its answer runs to the token limit) and the Messages API no
// log-probs (its tokens are not shaded); the G-NLL is computed alike.
function apiRequest(api, prompt, tools = null) {
  const c = state.config;
  const user = [{ role: "user", content: prompt }];
  if (api === "responses") {
    return ["/v1/responses", { input: prompt, temperature: 0, max_output_tokens: c.max_tokens,
      include: ["message.output_text.logprobs"], top_logprobs: 5, stream: true }];
  }
  if (api === "messages") {
    return ["/v1/messages", { messages: user, temperature: 0, max_tokens: c.max_tokens,
      stop_sequences: c.stop, stream: true }];
  }
  if (tools) {  // the model decides whether to call; the page's stop strings would cut a call
    return ["/v1/chat/completions", { messages: user, temperature: 0, max_tokens: c.max_tokens,
      tools, tool_choice: "auto", logprobs: true, stream: true }];
  }
  return ["/v1/chat/completions", { messages: user, temperature: 0, max_tokens: c.max_tokens,
    stop: c.stop, logprobs: true, top_logprobs: 5, stream: true }];
}

// One event of any of the three APIs' streams as what it adds to the answer: its text, its
// log-prob entries, its finish reason and uncertainty (chunks of chat; named events of the others).
function piecesOf(data) {
  if (data.error) throw new Error(data.error.message || String(data.error));
  if (data.choices) {
    return data.choices.map((c) => ({ text: (c.delta && c.delta.content) || "",
      entries: (c.logprobs && c.logprobs.content) || [], finish: c.finish_reason, uncertainty: c.uncertainty,
      calls: (c.delta && c.delta.tool_calls) || [] }));
  }
  switch (data.type) {
    case "error": throw new Error(data.message || "the stream ended in an error");
    case "response.output_text.delta": return [{ text: data.delta, entries: data.logprobs || [] }];
    case "response.output_item.done":
      return data.item.type === "message" ? [{ text: "", entries: [], uncertainty: data.item.uncertainty }] : [];
    case "response.completed": case "response.incomplete":
      return [{ text: "", entries: [], finish: data.response.status === "incomplete" ? "length" : "stop" }];
    case "content_block_delta":
      return data.delta.type === "text_delta" ? [{ text: data.delta.text, entries: [] }] : [];
    case "message_delta":
      return [{ text: "", entries: [], finish: data.delta.stop_reason, uncertainty: data.uncertainty }];
    default: return [];
  }
}

// Reads the server-sent events of a streamed answer, showing its tokens as they arrive; resolves
// to the choice as a non-streamed response has it (the uncertainty comes with the last chunk).
async function readStream(r) {
  const reader = r.body.getReader();
  const decoder = new TextDecoder();
  const answer = $("answer");
  answer.innerHTML = "";
  answer.dataset.state = "streaming";
  $("result").hidden = false;
  const choice = { message: { content: "", tool_calls: [] }, logprobs: { content: [] }, uncertainty: null };
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const line = event.split("\n").find((l) => l.startsWith("data: "));
      if (!line || line === "data: [DONE]") continue;
      for (const c of piecesOf(JSON.parse(line.slice(6)))) {
        const text = c.text;
        const entries = c.entries;
        choice.logprobs.content.push(...entries);
        if (text) {
          const span = document.createElement("span");
          span.className = "tok live";
          span.textContent = choice.message.content ? text : text.replace(/^\s+/, "");
          const lp = entries.reduce((s, e) => s + e.logprob, 0);
          if (entries.length) span.style.background = shade(Math.exp(lp));
          answer.appendChild(span);
          choice.message.content += text;
        }
        for (const d of c.calls || []) {  // tool-call deltas: a call's name, then its arguments
          const call = (choice.message.tool_calls[d.index] ||= { function: { name: "", arguments: "" } });
          if (d.function && d.function.name) call.function.name += d.function.name;
          if (d.function && d.function.arguments) call.function.arguments += d.function.arguments;
        }
        if (c.finish) choice.finish_reason = c.finish;
        if (c.uncertainty) choice.uncertainty = c.uncertainty;
      }
    }
  }
  if (!choice.uncertainty) throw new Error("the answer's stream ended without its uncertainty");
  return choice;
}

// Whether the answer to a picked example is right, by the evaluation's own rule (server side).
async function judge(q, text) {
  const r = await fetch("/ui/api/judge", {
    method: "POST",
    headers: headers(),
    body: JSON.stringify({ answer: text, answers: q.gold, numeric_answer: q.numeric ?? null }),
  });
  const body = await r.json();
  if (!r.ok) throw new Error(body.error ? body.error.message : r.statusText);
  return body;
}

function render(q, choice, verdict) {
  const u = choice.uncertainty;
  const answer = $("answer");
  answer.innerHTML = "";
  if (!u.tokens || !u.tokens.length) {
    // Refused (or log-probs not sent): the text as the client received it, unshaded; an answer
    // that is only tool calls (a larger model's, after an escalation) as the calls it sent.
    const span = document.createElement("span");
    const calls = (choice.message.tool_calls || []).map((c) => `${c.function.name}(${c.function.arguments})`);
    span.textContent = choice.message.content || calls.join("\n");
    answer.appendChild(span);
  }
  const tops = (choice.logprobs && choice.logprobs.content) || [];
  (u.tokens || []).forEach((tok, t) => {
    const lp = u.token_logprobs[t];
    const p = Math.exp(lp);
    const span = document.createElement("span");
    span.className = "tok";
    span.textContent = t === 0 ? tok.replace(/^\s+/, "") : tok;
    span.style.background = shade(p);
    span.dataset.logprob = String(lp);
    const alts = (tops[t] && tops[t].top_logprobs) || [];
    span.dataset.tip = `token ${JSON.stringify(tok)}\nlog-prob ${lp.toFixed(4)}  (p = ${p.toFixed(3)})\n` +
      (alts.length ? "top alternatives:\n" + alts.map((a) => `  ${JSON.stringify(a.token)}  ${a.logprob.toFixed(3)}`).join("\n")
                   : "top alternatives: not reported by this model");
    answer.appendChild(span);
  });
  markLeastSpan(u);
  showToolCalls(u);
  if (u.refused) {
    const note = document.createElement("div");
    note.className = "muted";
    note.textContent = "Refused: the server withheld the model's answer.";
    answer.appendChild(note);
  }
  $("gold").textContent = q.gold ? "Gold: " + q.gold.slice(0, 5).join(" | ") : "";
  $("asked").textContent = "Asked with " + q.asked + ".";
  const v = $("verdict");
  v.hidden = !verdict;
  if (verdict) {
    v.className = "verdict " + (verdict.correct ? "right" : "wrong");
    v.textContent = (verdict.correct ? "✓ right" : "✗ wrong") + ` (${verdict.rule})`;
  }
  $("g-nll").textContent = fmt(u.g_nll);
  $("g-nll").dataset.value = String(u.g_nll);
  $("n-tokens").textContent = `${u.num_tokens} ${u.num_tokens === 1 ? "token" : "tokens"}`;
  const pol = state.config.policy;
  const p = u.p_correct;
  $("p-correct").textContent = p === null || p === undefined ? "not calibrated" : fmt(p, 3);
  $("p-correct").className = "big" + (p === null || p === undefined ? " none" : "");
  $("gauge-fill").style.width = p === null || p === undefined ? "0" : `${Math.round(100 * p)}%`;
  // The calibration and its rule are named once, in the rule line under the Ask button.
  $("calibration").textContent = pol.calibrated ? "calibrated (see the rule above)" : "start the server with --calibration FILE for p(correct)";
  const d = $("decision");
  const none = !u.escalated && (u.abstain === null || u.abstain === undefined);
  // Without a policy nothing was decided: no verdict colour (green would read as "kept").
  d.className = "big " + (u.escalated ? "escalated" : none ? "no-policy" : u.abstain ? "abstain" : "answer-ok");
  d.textContent = decisionLabel(u);
  $("policy").textContent = `policy ${pol.policy}`;
  // Under --policy escalate: who answered, and why (the local model's G-NLL, or the failed
  // escalation whose place the local answer took).
  const by = $("answered-by");
  by.hidden = !u.answered_by;
  if (u.escalated && u.local) {
    by.textContent = `answered by ${u.answered_by}: the local model ${u.local.model} was unsure ` +
      `(G-NLL ${fmt(u.local.g_nll)}${u.local.g_nll_is_lower_bound ? " or more" : ""})`;
  } else if (u.answered_by) {
    by.textContent = `answered by ${u.answered_by}` +
      (u.escalation_error ? ` (the escalation failed: ${u.escalation_error})` : " (the local model)");
  }
  // An exact early decision: where it was made, and the tokens it spared (this answer's own, or
  // the local model's before an escalation).
  const early = u.early ? u : u.local && u.local.early ? u.local : null;
  $("early").hidden = !early;
  if (early) {
    const who = early === u.local ? `the local model ${u.local.model} ` : "";
    $("early").textContent = `${who}decided at token ${early.decided_at_token} (G-NLL ${fmt(early.g_nll)} ` +
      `already past the threshold; exact); ${early.tokens_saved} tokens never generated`;
  }
  $("result").hidden = false;
  answer.dataset.state = "done";
  const correct = verdict ? verdict.correct : null;
  const calls = (choice.message.tool_calls || []).map((c) => `${c.function.name}(${c.function.arguments})`);
  state.history.push({ g: u.g_nll, p, decision: decisionLabel(u), correct, q: q.question,
    a: choice.message.content || calls.join("; ") });
  drawHistory();
}

// Outlines the tokens of the least certain sentence (or JSON field) and names it under the answer.
// Span offsets are characters of the answer text; a token belongs to the span it overlaps most.
function markLeastSpan(u) {
  const box = $("least-span");
  box.textContent = "";
  // least_certain_span is the span's path ("2", "$.city"), as on every gnll surface
  const span = (u.spans || []).find((s) => s.path === u.least_certain_span);
  if (!span || u.spans.length < 2) return;
  let pos = 0;
  for (const el of $("answer").querySelectorAll(".tok")) {
    const start = pos;
    pos += el.textContent.length;
    const overlap = Math.min(pos, span.end) - Math.max(start, span.start);
    if (overlap > 0 && 2 * overlap >= el.textContent.trim().length) el.classList.add("least");
  }
  const what = u.spans_kind === "json" ? `field ${span.path}` : "sentence";
  box.textContent = `Least certain ${what}: “${span.text}” — NLL ${fmt(span.nll)} nats over ${span.num_tokens} tokens (of G-NLL ${fmt(u.nll)})`;
}

// One line per tool call: its function, G-NLL and least certain argument (its path and NLL; the
// argument's tokens outlined when the call was sent); a withheld call says so, without its text
// (the server never sent it). After an escalation, the local model's withheld calls too.
function showToolCalls(u) {
  const box = $("tool-calls");
  box.innerHTML = "";
  const line = (call, who) => {
    const div = document.createElement("div");
    const arg = (call.arguments || []).find((a) => a.path === call.least_certain_argument);
    let text = `${who}tool call ${call.name || "(unnamed)"}: G-NLL ${fmt(call.g_nll)} nats over ${call.num_tokens} tokens`;
    text += arg
      ? `; least certain argument ${arg.path} — NLL ${fmt(arg.nll)} over ${arg.num_tokens} tokens`
      : "; no arguments";
    if (call.arguments_over_threshold && call.arguments_over_threshold.length) {
      text += ` (over the argument threshold: ${call.arguments_over_threshold.join(", ")})`;
    }
    if (call.withheld) {
      div.className = "withheld";
      text += " — withheld: the call never reached the client";
    }
    div.textContent = text;
    div.dataset.argument = call.least_certain_argument || "";
    box.appendChild(div);
    if (arg && !call.withheld && who === "") {
      const toks = $("answer").querySelectorAll(".tok");
      for (const k of arg.token_indices || []) if (toks[k]) toks[k].classList.add("least-arg");
    }
  };
  (u.tool_calls || []).forEach((c) => line(c, ""));
  ((u.local && u.local.tool_calls) || []).forEach((c) => line(c, `the local model ${u.local.model}'s `));
}

// The decision box's word: an escalated answer is the larger model's (its record has no abstain
// of its own), an answer without a policy has no decision.
function decisionLabel(u) {
  if (u.escalated) return "escalated";
  if (u.abstain === null || u.abstain === undefined) return "no policy";
  return u.abstain ? "abstain" : "answer";
}

function drawHistory() {
  const rows = [...state.history].sort((a, b) => b.g - a.g);
  $("history-empty").hidden = rows.length > 0;
  $("history").querySelector("tbody").innerHTML = "";
  for (const h of rows) {
    const tr = document.createElement("tr");
    const mark = h.correct === null || h.correct === undefined ? "–" : h.correct ? "✓" : "✗";
    for (const v of [fmt(h.g), p2(h.p), h.decision === "no policy" ? "–" : h.decision, mark, h.q, h.a]) {
      const td = document.createElement("td");
      td.textContent = v;
      if (v === mark && mark !== "–") td.className = h.correct ? "right" : "wrong";
      tr.appendChild(td);
    }
    $("history").querySelector("tbody").appendChild(tr);
  }
}

function p2(p) {
  return p === null || p === undefined ? "–" : fmt(p, 3);
}

document.addEventListener("mouseover", (e) => {
  const tip = $("tooltip");
  if (e.target.classList && e.target.classList.contains("tok")) {
    tip.textContent = e.target.dataset.tip;
    tip.hidden = false;
    const r = e.target.getBoundingClientRect();
    tip.style.left = `${r.left}px`;
    // Above the token where there is room, so the scores below stay readable.
    const above = r.top - tip.offsetHeight - 6;
    tip.style.top = `${above > 0 ? above : r.bottom + 6}px`;
  } else {
    tip.hidden = true;
  }
});
$("ask-form").addEventListener("submit", ask);
// Enter asks (as in a chat box); Shift+Enter keeps the newline.
$("question").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
    e.preventDefault();
    $("ask-form").requestSubmit();
  }
});
$("task").addEventListener("change", loadExamples);
$("example").addEventListener("change", () => { if ($("example").value !== "") $("question").value = ""; });
init();
