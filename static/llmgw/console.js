// The console's small helpers; htmx does the requests.
//
// 1. Touched fields: a form marked data-touched keeps, in its hidden _touched input, the
//    names of the fields the user has left or changed. catalog.views.servedmodel_validate
//    shows a field's errors only once its name is there. Listening in the capture phase
//    runs this before htmx sends the check the same event triggers.
// 2. Checks not lost: a form's live check (an element marked data-check, see
//    templates/catalog/servedmodel_form.html) runs one at a time, and htmx drops a check
//    asked for while another is in flight. Such a check is sent again once the one in
//    flight is done, so the last field left is always checked. While the form itself is
//    saving, checks are dropped for good: the Save's answer shows every error.
// 3. Suggestions: an input with data-suggest="a,b,c" (catalog.forms._suggest) gets a
//    datalist of those values: a text box with suggestions, so an unknown value still
//    reaches the rules and their message.
(function () {
  "use strict";

  function track(event) {
    var el = event.target;
    if (!el || !el.name || !el.form || el.name.charAt(0) === "_") {
      return;
    }
    if (!el.form.hasAttribute("data-touched")) {
      return;
    }
    var box = el.form.elements.namedItem("_touched");
    if (!box) {
      return;
    }
    var names = box.value ? box.value.split(",") : [];
    if (names.indexOf("*") === -1 && names.indexOf(el.name) === -1) {
      names.push(el.name);
      box.value = names.join(",");
    }
  }

  function suggest(root) {
    if (!root || !root.querySelectorAll) {
      return;
    }
    root.querySelectorAll("input[data-suggest]").forEach(function (input) {
      var values = input.getAttribute("data-suggest").split(",").filter(Boolean);
      var id = "suggest-" + values.join("-").replace(/[^A-Za-z0-9-]/g, "_");
      if (!document.getElementById(id)) {
        var list = document.createElement("datalist");
        list.id = id;
        values.forEach(function (value) {
          var option = document.createElement("option");
          option.value = value;
          list.appendChild(option);
        });
        document.body.appendChild(list);
      }
      input.setAttribute("list", id);
    });
  }

  document.addEventListener("htmx:confirm", function (event) {
    var elt = event.detail.elt;
    if (!elt.hasAttribute || !elt.hasAttribute("data-check")) {
      return;
    }
    var form = elt.closest("form");
    if (form && form.classList.contains("htmx-request")) {
      event.preventDefault();
    } else if (elt.classList.contains("htmx-request")) {
      elt.setAttribute("data-check-again", "");
      event.preventDefault();
    }
  });
  document.addEventListener("htmx:afterRequest", function (event) {
    var elt = event.detail.elt;
    if (!elt.hasAttribute || !elt.hasAttribute("data-check-again")) {
      return;
    }
    elt.removeAttribute("data-check-again");
    // After the current request has finished its bookkeeping.
    window.setTimeout(function () {
      if (document.body.contains(elt)) {
        htmx.trigger(elt, "llmgw:recheck");
      }
    }, 0);
  });

  document.addEventListener("focusout", track, true);
  document.addEventListener("change", track, true);
  // Typed in is touched too: a check sent while typing (the schedule editor's, a
  // profile's class and width) shows that field's errors before it is left.
  document.addEventListener("input", track, true);
  // htmx:load fires for the page at start and for every fragment swapped in.
  document.addEventListener("htmx:load", function (event) {
    suggest(event.target);
  });
  document.addEventListener("DOMContentLoaded", function () {
    suggest(document);
  });
})();

// Live console (cluster.consumers): the socket's state in the badge marked
// data-live-status, and every <time data-age> kept as "3 min" without a push.
// Heartbeats push nothing (only state changes do): while a page shows a node's
// <time data-heartbeat>, every 5 s the page asks its data-heartbeats URL (one small
// JSON answer: each node's last heartbeat and the server's clock) and counts each
// age from there, on the server's clock, so a wrong clock here does not skew them.
// A dropped socket is retried after a random wait of up to 0.5, 1, 2, 4, then at most
// 5 seconds: the extension's own back-off grows to 64 s, so a console could stay stale
// for a minute after a web process restarted. The randomness spreads the reconnects of
// many consoles; the snapshot each reconnect brings shows what was missed.
(function () {
  "use strict";

  var RECONNECT_CAP_MS = 5000;
  htmx.config.wsReconnectDelay = function (retries) {
    return Math.random() * Math.min(RECONNECT_CAP_MS, 500 * Math.pow(2, Math.min(retries, 4)));
  };

  var shown = ""; // what the badge says: "on" (live), "stale", "off"
  function status(text, cls, why) {
    shown = cls;
    document.querySelectorAll("[data-live-status]").forEach(function (el) {
      if (!el.hasAttribute("data-title")) {
        el.setAttribute("data-title", el.getAttribute("title") || "");
      }
      el.textContent = text;
      el.className = "badge live-status " + cls;
      el.setAttribute("title", why || el.getAttribute("data-title"));
    });
  }
  // The hub's heartbeat (llmgw_admin.hub, every 2 s) and every push count as heard; a
  // page whose socket is open but has heard nothing for STALE_MS is not being kept
  // current (a frozen web process, a stopped hub) and says "stale", never "live",
  // until a message comes again. An open socket alone is not "live": the server accepts
  // it before it subscribes, and closes it at once while Redis is away (1013), so the
  // page says "live" from the first message on (the snapshot, sent once subscribed).
  var BEAT = "<!-- llmgw:beat -->";
  var STALE_MS = 5000;
  var heard = 0;
  var open = false;
  document.addEventListener("htmx:wsOpen", function () {
    heard = Date.now();
    open = true;
    status("connecting…", "off", "the socket is open; waiting for the server's first message");
  });
  document.addEventListener("htmx:wsBeforeMessage", function (event) {
    heard = Date.now();
    if (shown !== "on") {
      status("live", "on");
    }
    if (event.detail && event.detail.message === BEAT) {
      event.preventDefault(); // nothing to swap
    }
  });
  setInterval(function () {
    if (open && shown !== "stale" && Date.now() - heard > STALE_MS) {
      status("stale", "stale", "nothing heard from the server for over " + STALE_MS / 1000 +
        " s: what the page shows may be out of date");
    }
  }, 1000);
  document.addEventListener("htmx:wsClose", function (e) {
    open = false;
    // 1008: refused for good (too many consoles of this user open); it is not retried.
    var closed = e.detail && e.detail.event;
    if (closed && closed.code === 1008) {
      status("not live: " + (closed.reason || "refused"), "off");
      return;
    }
    status("reconnecting…", "off");
  });
  document.addEventListener("htmx:wsError", function () {
    open = false;
    status("reconnecting…", "off");
  });

  function age(seconds) {
    if (seconds < 60) { return Math.max(0, Math.floor(seconds)) + " s"; }
    if (seconds < 3600) { return Math.floor(seconds / 60) + " min"; }
    if (seconds < 86400) { return Math.floor(seconds / 3600) + " h " + Math.floor((seconds % 3600) / 60) + " min"; }
    return Math.floor(seconds / 86400) + " d";
  }
  var skew = 0; // the server's clock minus this browser's, from the last answer
  function ages() {
    var now = Date.now() + skew;
    document.querySelectorAll("time[data-age]").forEach(function (el) {
      var at = Date.parse(el.getAttribute("datetime"));
      if (!isNaN(at)) {
        var text = age((now - at) / 1000);
        el.textContent = el.closest("[data-node]") ? text + " ago" : text;
      }
    });
  }

  var HEARTBEATS_MS = 5000;
  var asking = false;
  function heartbeats() {
    var first = document.querySelector("time[data-heartbeats]");
    if (!first || asking || document.hidden) {
      return;
    }
    asking = true;
    var sent = Date.now();
    fetch(first.getAttribute("data-heartbeats"), {
      credentials: "same-origin",
      headers: { Accept: "application/json" },
    })
      .then(function (response) {
        if (!response.ok) {
          throw new Error("heartbeats: " + response.status);
        }
        return response.json();
      })
      .then(function (data) {
        var server = Date.parse(data.now);
        if (!isNaN(server)) {
          skew = server - (sent + Date.now()) / 2;
        }
        document.querySelectorAll("time[data-heartbeat]").forEach(function (el) {
          var stamp = data.nodes[el.getAttribute("data-heartbeat")];
          var shown = Date.parse(el.getAttribute("datetime"));
          // A fragment pushed meanwhile may already show a later one.
          if (stamp && !(Date.parse(stamp) <= shown)) {
            el.setAttribute("datetime", stamp);
          }
        });
        ages();
      })
      .catch(function () {
        // Signed out, or the web process away: the socket's badge says so; ages go on.
      })
      .then(function () {
        asking = false;
      });
  }

  document.addEventListener("DOMContentLoaded", function () {
    ages();
    heartbeats();
  });
  document.addEventListener("htmx:wsAfterMessage", ages);

  // A node's drain message (templates/cluster/partials/drain_refused.html) is kept through
  // pushes of its card (hx-preserve). An action on the node clears it as it starts, and a
  // refusal naming a model whose block a push removed (the model deleted, or left with no
  // replica) is dropped: its "Drain anyway" would act on what is no longer so.
  document.addEventListener("htmx:beforeRequest", function (event) {
    var elt = event.detail.elt;
    var card = elt && elt.closest ? elt.closest("article.node") : null;
    var message = card ? document.getElementById(card.id + "-drain") : null;
    if (message && elt.tagName === "BUTTON") {
      message.innerHTML = "";
    }
  });
  document.addEventListener("htmx:wsAfterMessage", function () {
    document.querySelectorAll("[data-role=drain-refused][data-blocks]").forEach(function (note) {
      var blocks = note.getAttribute("data-blocks").split(" ").filter(Boolean);
      if (blocks.some(function (id) { return !document.getElementById(id); })) {
        note.remove();
      }
    });
  });
  document.addEventListener("visibilitychange", heartbeats);
  setInterval(ages, 1000);
  setInterval(heartbeats, HEARTBEATS_MS);
})();

// GPU class picker (catalog.views): a class picked from a profile row's "cluster
// classes" list (data-pick, see templates/catalog/partials/gpu_class_picker.html) fills
// that row's gpu_class box as typing would: the box's input and change events fire, so
// it is marked touched and checked, and its note says what the cluster has of the class.
(function () {
  "use strict";

  document.addEventListener("click", function (event) {
    var button = event.target && event.target.closest ? event.target.closest("button[data-pick]") : null;
    if (!button) {
      return;
    }
    var field = button.closest(".field");
    var input = field ? field.querySelector("input[name$='-gpu_class']") : null;
    if (!input) {
      return;
    }
    input.value = button.getAttribute("data-pick");
    input.dispatchEvent(new Event("input", { bubbles: true }));
    input.dispatchEvent(new Event("change", { bubbles: true }));
    var details = button.closest("details");
    if (details) {
      details.open = false;
    }
  });
})();
