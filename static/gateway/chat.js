// The console's chat page (templates/gateway/chat.html): a conversation streamed through
// the gateway as the signed-in user (gateway/session.py), with what answered, the time
// to the first token, tokens per second and any refusal with its judge and categories,
// and the request id the gateway gave it (x-request-id), linked to its refusal record.
(function () {
  "use strict";

  var root = document.getElementById("chat");
  if (!root) {
    return;
  }
  var path = root.getAttribute("data-chat-path");
  var refusals = root.getAttribute("data-refusals-path");
  var statePath = root.getAttribute("data-state-path");
  var form = document.getElementById("chat-form");
  var log = document.getElementById("chat-log");
  var stats = document.getElementById("chat-stats");
  var input = document.getElementById("chat-message");
  var select = document.getElementById("chat-model");
  var send = document.getElementById("chat-send");
  var replicas = JSON.parse(root.getAttribute("data-replicas") || "{}");
  var messages = [];

  function line(role, text) {
    var p = document.createElement("div");
    p.className = "chatline " + role;
    p.setAttribute("data-role", role);
    var who = document.createElement("strong");
    who.textContent = role === "user" ? "you: " : role === "assistant" ? "model: " : "";
    var body = document.createElement("span");
    body.className = "text";
    body.textContent = text;
    p.appendChild(who);
    p.appendChild(body);
    log.appendChild(p);
    return body;
  }

  function refusal(message, requestId) {
    var body = line("refusal", message);
    var p = body.parentNode;
    p.setAttribute("data-role", "refusal");
    if (requestId) {
      // The id the client got: an operator finds the refusal's record by it.
      p.setAttribute("data-request-id", requestId);
      var id = document.createElement("span");
      id.className = "small muted request-id";
      id.appendChild(document.createTextNode(" request "));
      var code = document.createElement("code");
      code.textContent = requestId;
      if (refusals) {
        var link = document.createElement("a");
        link.href = refusals + "?request_id=" + encodeURIComponent(requestId);
        link.title = "its refusal record";
        link.appendChild(code);
        id.appendChild(link);
      } else {
        id.appendChild(code);
      }
      p.appendChild(id);
    }
    return body;
  }

  function say(text) {
    stats.textContent = text;
  }

  // While a send waits for its first token, what it waits for (gateway.views.chat_state,
  // asked about once a second): a model woken from zero, its replica starting or loading,
  // waiting for room. Returns the function that stops it.
  function describe(model, state) {
    var rs = (state.replicas || []).slice();
    if (rs.some(function (r) { return r.state === "ready"; })) {
      return "waiting for the first token from " + model + "…";
    }
    if (!rs.length) {
      return "waking " + model + ": asking for a replica…";
    }
    var order = ["loading", "starting", "pending", "failed", "stopping", "stopped"];
    rs.sort(function (a, b) { return order.indexOf(a.state) - order.indexOf(b.state); });
    var r = rs[0];
    var text = "waking " + model + ": replica #" + r.id + " " + r.state;
    if (r.nodes.length) {
      text += " on " + r.nodes.join(", ");
    }
    if (r.state === "loading" && r.progress !== null) {
      text += " (" + r.progress + "%)";
    }
    if (r.reason && r.state !== "loading" && r.state !== "starting") {
      text += ": " + r.reason;
    }
    return text + "…";
  }

  function waiting(model) {
    var stopped = false;
    var timer = null;
    function ask() {
      fetch(statePath + "?model=" + encodeURIComponent(model), { credentials: "same-origin" })
        .then(function (resp) { return resp.ok ? resp.json() : null; })
        .then(function (state) {
          if (!stopped && state) {
            say(describe(model, state));
          }
        })
        .catch(function () { /* asked again below */ })
        .then(function () {
          if (!stopped) {
            timer = window.setTimeout(ask, 1000);
          }
        });
    }
    stats.setAttribute("data-phase", "waiting");
    say("sent to " + model + "…");
    timer = window.setTimeout(ask, 250);
    return function () {
      if (!stopped) {
        stopped = true;
        window.clearTimeout(timer);
        stats.removeAttribute("data-phase");
        say("");
      }
    };
  }

  // A send answered "no room" says so in the model's note too (the note said what the
  // page knew when it opened: a wake may meet a cluster that has filled since).
  function noted(model, code, message) {
    var note = code === "model_unplaceable" ? "no node in this cluster can run it"
      : code === "model_unavailable" && message.indexOf("has no room to start") !== -1
        ? "no room in the cluster now" : "";
    Array.prototype.forEach.call(select.options, function (option) {
      if (note && option.value === model) {
        option.textContent = (option.getAttribute("data-label") || model) + " — " + note;
      }
    });
  }

  document.getElementById("chat-clear").addEventListener("click", function () {
    messages = [];
    log.textContent = "";
    say("");
  });

  form.addEventListener("submit", function (event) {
    event.preventDefault();
    var text = input.value.trim();
    if (!text || send.disabled) {
      return;
    }
    var model = select.value;
    messages.push({ role: "user", content: text });
    line("user", text);
    input.value = "";
    send.disabled = true;
    var token = form.querySelector("input[name=csrfmiddlewaretoken]").value;
    var start = performance.now();
    var first = null;
    var tokens = null;
    var answer = "";
    var out = null;
    var refused = false;
    var stop = waiting(model);
    fetch(path, {
      method: "POST",
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-CSRFToken": token },
      body: JSON.stringify({
        model: model,
        messages: messages,
        stream: true,
        stream_options: { include_usage: true },
      }),
    })
      .then(function (resp) {
        var replica = resp.headers.get("x-llmgw-replica") || "";
        var served = resp.headers.get("x-llmgw-model") || model;
        var who = replica ? replicas[replica] || served + " #" + replica : served;
        var requestId = resp.headers.get("x-request-id") || "";
        if (!resp.ok || !resp.body) {
          return resp.text().then(function (body) {
            var message = body;
            var code = "";
            try {
              var error = JSON.parse(body).error;
              message = error.message;
              code = error.code || "";
            } catch (e) {
              /* the body as it came */
            }
            stop();
            refusal(message, requestId);
            messages.pop();
            noted(model, code, message);
            // The guard's refusal is no replica's error (the message names the judge).
            if (code === "content_filter") {
              say("refused by the guard");
            } else {
              say("HTTP " + resp.status + (code ? " " + code : "") + (replica ? " from " + who : ""));
            }
          });
        }
        out = line("assistant", "");
        out.parentNode.setAttribute("data-replica", replica);
        var reader = resp.body.getReader();
        var decoder = new TextDecoder();
        var buffer = "";

        function handle(data) {
          if (data === "[DONE]") {
            return;
          }
          var chunk;
          try {
            chunk = JSON.parse(data);
          } catch (e) {
            return;
          }
          if (chunk.error) {
            refused = true;
            stop();
            refusal(chunk.error.message, requestId);
            return;
          }
          if (chunk.usage && chunk.usage.completion_tokens != null) {
            tokens = chunk.usage.completion_tokens;
          }
          (chunk.choices || []).forEach(function (choice) {
            var delta = (choice.delta && choice.delta.content) || "";
            if (delta) {
              if (first === null) {
                first = performance.now();
                stop();
              }
              answer += delta;
              out.textContent = answer;
            }
            if (choice.finish_reason === "content_filter") {
              refused = true;
            }
          });
        }

        function pump() {
          return reader.read().then(function (step) {
            if (step.done) {
              return;
            }
            buffer += decoder.decode(step.value, { stream: true });
            var events = buffer.split("\n\n");
            buffer = events.pop();
            events.forEach(function (event) {
              event.split("\n").forEach(function (l) {
                if (l.indexOf("data: ") === 0) {
                  handle(l.slice(6));
                }
              });
            });
            return pump();
          });
        }

        return pump().then(function () {
          stop();
          var end = performance.now();
          var parts = ["answered by " + who];
          if (first !== null) {
            parts.push("TTFT " + Math.round(first - start) + " ms");
            if (tokens && end > first) {
              parts.push((tokens / ((end - first) / 1000)).toFixed(1) + " tokens/s");
            }
          }
          if (tokens !== null) {
            parts.push(tokens + " tokens");
          }
          if (refused) {
            parts.push("refused by the guard");
            messages.pop();
          } else {
            messages.push({ role: "assistant", content: answer });
          }
          say(parts.join(" · "));
        });
      })
      .catch(function (error) {
        stop();
        refusal("the request failed: " + error);
        messages.pop();
      })
      .then(function () {
        send.disabled = false;
      });
  });
})();
