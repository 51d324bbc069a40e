"""``save_state``/``load_state`` of everything the loop needs to resume, as a dict."""


def save_state(store, model, optimizer, lr_scheduler, scaler, completed_steps):
    store["model"] = {k: v.clone() for k, v in model.state_dict().items()}
    store["optimizer"] = optimizer.state_dict()
    store["lr_scheduler"] = lr_scheduler.state_dict()
    store["scaler"] = scaler.state_dict()
    store["completed_steps"] = completed_steps


def load_state(store, model, optimizer, lr_scheduler, scaler):
    model.load_state_dict(store["model"])
    optimizer.load_state_dict(store["optimizer"])
    lr_scheduler.load_state_dict(store["lr_scheduler"])
    scaler.load_state_dict(store["scaler"])
    return store["completed_steps"]
